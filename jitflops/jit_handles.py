"""fvcore's ``jit_handles``: handle functions called the fvcore way, with an op's JIT values.

``from fvcore.nn.jit_handles import addmm_flop_jit`` becomes ``from jitflops.jit_handles import
addmm_flop_jit``. Each handle takes the op's input and output ``torch._C.Value`` lists and returns
a count, as in fvcore; the counts are jitflops' formulas (the same as fvcore's wherever fvcore
counts right, and right where it is not: broadcast batch dims, 1-D operands, rank > 5 norms). The
per-op handles are ``ShapeFormula`` objects, which also take op records: they work with the dispatch
backend too.
"""

from __future__ import annotations

from collections import Counter
from numbers import Number
from typing import Any, Optional, Union

from .handles.convolution import conv_macs, convolution_flops
from .handles.einsum import einsum_flops
from .handles.linear_algebra import addmm_flops, linear_flops, matmul_flops
from .handles.normalization import batch_norm_flops
from .handles.registry import FvcoreHandle as Handle, ShapeFormula
from .handles.shapes import get_shape, prod

__all__ = [
    "Handle",
    "addmm_flop_jit",
    "batchnorm_flop_jit",
    "bmm_flop_jit",
    "conv_flop_count",
    "conv_flop_jit",
    "einsum_flop_jit",
    "elementwise_flop_counter",
    "generic_activation_jit",
    "get_shape",
    "linear_flop_jit",
    "matmul_flop_jit",
    "norm_flop_counter",
]


addmm_flop_jit = ShapeFormula(addmm_flops)
linear_flop_jit = ShapeFormula(linear_flops)
bmm_flop_jit = ShapeFormula(matmul_flops)
matmul_flop_jit = ShapeFormula(matmul_flops)
einsum_flop_jit = ShapeFormula(einsum_flops)
conv_flop_jit = ShapeFormula(convolution_flops, key="conv")
batchnorm_flop_jit = ShapeFormula(batch_norm_flops)


def conv_flop_count(x_shape: list[int], w_shape: list[int], out_shape: list[int], transposed: bool = False) -> int:
    """Multiply-adds of a convolution from its input, weight and output shapes (fvcore's signature)."""
    return conv_macs(tuple(x_shape), tuple(w_shape), tuple(out_shape), transposed)


def generic_activation_jit(op_name: Optional[str] = None) -> Handle:
    """A handle counting the op's output elements, under ``op_name`` if given."""

    def activation_handle(inputs: list, outputs: list) -> Union[Number, Counter]:
        count = prod(get_shape(outputs[0]))
        return Counter({op_name: count}) if op_name is not None else count

    return activation_handle


def norm_flop_counter(affine_arg_index: int) -> Handle:
    """A norm handle: 5 flops per input element with an affine transform (the input at
    ``affine_arg_index``), 4 without; inputs of any rank."""

    def norm_handle(inputs: list, outputs: list) -> int:
        has_affine = get_shape(inputs[affine_arg_index]) is not None
        return prod(get_shape(inputs[0])) * (5 if has_affine else 4)

    return norm_handle


def elementwise_flop_counter(input_scale: float = 1, output_scale: float = 0) -> Handle:
    """``input.numel() * input_scale + output.numel() * output_scale`` (first input, first output)."""

    def elementwise_handle(inputs: list, outputs: list) -> float:
        count: Any = 0
        if input_scale != 0:
            count += input_scale * prod(get_shape(inputs[0]))
        if output_scale != 0:
            count += output_scale * prod(get_shape(outputs[0]))
        return count

    return elementwise_handle
