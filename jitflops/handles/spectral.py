"""Fast Fourier transforms: the standard ``N log2 N`` count.

A transform over dims of lengths ``n1, n2, ...`` of a signal of ``N`` elements in all (batch dims
included) counts ``N x log2(n1 x n2 x ...)``, rounded: the radix-2 butterfly count, one complex
multiply-add per element per stage. The signal is the full-length side of the transform: the
complex input or output of ``fft``/``ifft``, the real side of ``rfft``/``irfft``/``hfft``/``ihfft``
(after the ``n``/``s`` padding or trimming).

The dispatch backend records the ``torch.fft`` functions as called (the JIT's ops), not the
``_fft_r2c``/``_fft_c2c``/``_fft_c2r`` kernels they run, which differ by torch version and input
dtype; those kernels are counted by the same rule where they run alone (the backward pass).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from ..core.records import OpRecord
from .registry import FLOP_FORMULAS
from .shapes import prod


def fft_macs(signal: Sequence[int], dims: Sequence[int]) -> int:
    lengths = prod(signal[d] for d in dims)
    return round(prod(signal) * math.log2(lengths)) if lengths > 1 else 0


def _transformed_dims(op: OpRecord, rank: int) -> list[int]:
    """The ``dim`` argument, normalised; by default the last one (1-D), two (2-D), ``len(s)`` or all."""
    dims = op.arg("dim")
    if dims is None:
        sizes = op.arg_or("s", None)
        dims = list(range(rank - len(sizes), rank)) if sizes else list(range(rank))
    elif isinstance(dims, int):
        dims = [dims]
    return [d % rank for d in dims]


_REAL_INPUT = frozenset({"rfft", "rfft2", "rfftn", "ihfft", "ihfft2", "ihfftn"})
_FFT_FUNCTIONS = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
FFT_KINDS = tuple(f"aten::fft_{name}{suffix}" for name in _FFT_FUNCTIONS for suffix in ("", "2", "n"))


@FLOP_FORMULAS.register(*FFT_KINDS)
def fft_flops(op: OpRecord) -> int:
    name = op.kind.removeprefix("aten::fft_")
    if name not in _REAL_INPUT:  # the output is the full-length signal
        output = op.output_shape()
        return fft_macs(output, _transformed_dims(op, len(output)))
    signal = list(op.shape("self"))
    dims = _transformed_dims(op, len(signal))
    lengths: Optional[list[int]] = [op.arg("n")] if op.has_arg("n") else op.arg("s")
    for d, length in zip(dims, lengths or ()):
        if length is not None and length != -1:
            signal[d] = length
    return fft_macs(signal, dims)


@FLOP_FORMULAS.register("aten::_fft_r2c", "aten::_fft_c2c")
def fft_kernel_flops(op: OpRecord) -> int:
    signal = op.shape("self")
    return fft_macs(signal, [d % len(signal) for d in op.arg("dim")])


@FLOP_FORMULAS.register("aten::_fft_c2r")
def inverse_real_fft_kernel_flops(op: OpRecord) -> int:
    signal = op.output_shape()
    return fft_macs(signal, [d % len(signal) for d in op.arg("dim")])


@FLOP_FORMULAS.register("aten::stft")
def stft_flops(op: OpRecord) -> int:
    """One real transform of ``n_fft`` points per frame (frames: the output's last dim; a real
    output has an extra last dim of two for the real and imaginary parts)."""
    output = op.outputs[0]
    shape = op.output_shape()
    if output.dtype is not None and not output.dtype.is_complex:
        shape = shape[:-1]
    return fft_macs((prod(shape[:-2]) * shape[-1], op.arg("n_fft")), (1,))
