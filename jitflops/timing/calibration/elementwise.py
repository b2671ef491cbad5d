"""Elementwise ops by kind: a copy, arithmetic, in place or not, and transcendental functions; their
time by elements.

On a CPU an elementwise op is not the copy bandwidth's: it allocates its output, splits the work
over the threads, and a transcendental function is bound by the vector unit, not memory, at rates
five times apart from one function to another (on a 2-core AVX2 EPYC, per million elements: ``exp``
0.7 ms, ``erf`` 1.1, ``tanh`` 2.1, ``log`` several, against 0.15 for an ``add``). Each kind is timed
as models call it, on float32 tensors of 4 Ki to 7.5 Mi elements: ``clone`` (copies, casts,
concatenations, pads), a copy that transposes (``transpose``: a layout change a ``contiguous``,
a ``reshape`` or a convolution makes), ``add`` of two tensors (arithmetic, comparisons, selections, ReLU-like
activations), ``add_`` (the same in place: no output to allocate), one function of each group
of transcendental ones (``exp``, ``tanh``, ``erf``, ``log``, ``sqrt``), and ``bernoulli_`` (random
numbers drawn, as training's dropout draws its mask: a CPU's generator is slower than any of them),
and ``isin`` against one value (a CPU runs it one element at a time, not by the vector unit: 380 us
for GPT-2's 50,257 token ids on a 2-core AVX-512 EPYC, 7.6 ns an element, twenty times an ``add``'s;
``generate``'s logits processors and stopping criteria call it each token over the vocabulary).
The mask is drawn with 0.9, as a dropout of 0.1 (the models' usual one) keeps its elements: a CPU
draws in a time that grows with the rarer outcome's probability (per element on a 2-core AVX-512
EPYC, 4.4 ns at 0.99 or 0.01, 5.8 at 0.9, 7.3 at 0.8, 11.7 at 0.5), so a dropout of 0.5 is priced
at half its time.
"""

from __future__ import annotations

from typing import Callable

import torch

from .budget import Budget, CallTimer, Maker, measured_curve, on_activations

ELEMENTS = (*(4**power for power in range(6, 12)), 15 * 2**19)
"""4 Ki to 7.5 Mi elements: 30 MiB of float32 at the largest, under the size glibc maps afresh
(:mod:`jitflops.estimates.costs.fresh_pages`, which prices a larger output's pages apart)."""

SERIAL_ELEMENTS = tuple(4**power for power in range(2, 10))
"""16 to 256 Ki elements, for ``isin``: a loop an element has no floor of a vectorized kernel's
size to read small calls from (the stopping criteria test one token id a step, 1.5 us with the call)."""

TRANSPOSED_WIDTH = 128
"""The ``transpose`` kind copies a (1, n / 128, 128) tensor transposed to its contiguous layout, as
a model turns a sequence of channels into an image (SegFormer's ``transpose(1, 2)`` before its
depthwise convolution): on a 2-core AVX-512 EPYC 0.4 to 1 ns an element in cache, five to ten times a
``clone``'s, by widths of 32 to 768 alike."""

KINDS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "copy": lambda x, y: x.clone(),
    "transpose": lambda x, y: x.view(1, -1, TRANSPOSED_WIDTH).transpose(1, 2).contiguous(),
    "arithmetic": lambda x, y: torch.add(x, y),
    "inplace": lambda x, y: x.add_(y),
    "exp": lambda x, y: torch.exp(y),
    "tanh": lambda x, y: torch.tanh(y),
    "erf": lambda x, y: torch.erf(y),
    "log": lambda x, y: torch.log(y),
    "sqrt": lambda x, y: torch.sqrt(y),
    "random": lambda x, y: x.bernoulli_(0.9),
    "serial": lambda x, y: torch.isin(x, y[:1]),
}


def elementwise_curves(timer: CallTimer, budget: Budget, host_s: float) -> dict[str, tuple[tuple[float, float], ...]]:
    """Each kind's (elements, seconds) curve, the kinds sharing ``budget``."""
    curves = {}
    for kind, run in KINDS.items():
        share = Budget(budget.left() / (len(KINDS) - len(curves)))

        def call_of(elements: int, run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = run) -> tuple[float, Maker]:
            def make() -> Callable[[], object]:
                x, y = torch.randn(elements, device=timer.device), torch.rand(elements, device=timer.device) + 0.5
                return on_activations(lambda: run(x, y), x, y)
            return elements, make
        curves[kind] = measured_curve(timer, share, SERIAL_ELEMENTS if kind == "serial" else ELEMENTS, call_of, host_s)
    return curves
