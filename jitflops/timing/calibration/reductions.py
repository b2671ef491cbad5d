"""Ops that reduce along rows or windows: norms, softmax, sums, pools; their time by the elements they read.

Each reads its input twice or more (a norm's mean and variance, then the normalised output; a
softmax's maximum, its sum of exponentials, then the quotients), or a window per output (a max
pool: ten times an add's time per element on a CPU), so its time is its own, not an elementwise
op's. A batch norm in eval mode computes no statistics (a scale and a shift per channel): a kind of
its own, and so is a reduction that returns where its maximum is (``argmax``, ``max`` along a
dimension: 0.9 ns an element on a 2-core AVX-512 EPYC, twelve times a ``sum``'s; ``generate``
takes one over the vocabulary each token). Timed on float32 rows of 768 (a layer norm), 256 (a
softmax over keys, a sum, an argmax), 64 channels (a batch norm), and 32 x 32 planes (a 3 x 3 max
pool of stride 2), 4 Ki to 7.5 Mi elements.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .budget import Budget, CallTimer, Maker, measured_curve, on_activations
from .elementwise import ELEMENTS

KINDS: dict[str, tuple[int, Callable[[torch.Tensor], torch.Tensor]]] = {
    "norm": (768, lambda x: F.layer_norm(x, (x.shape[-1],))),
    "batch_norm": (64, lambda x: F.batch_norm(x, torch.zeros(x.shape[-1], device=x.device), torch.ones(x.shape[-1], device=x.device))),
    "softmax": (256, lambda x: F.softmax(x, -1)),
    "reduction": (256, lambda x: x.sum(-1)),
    "index_reduction": (256, lambda x: x.argmax(-1)),
    "pool": (1024, lambda x: F.max_pool2d(x.view(1, -1, 32, 32), 3, 2, 1)),
}
"""Each kind's row length and call."""


def reduction_curves(timer: CallTimer, budget: Budget, host_s: float) -> dict[str, tuple[tuple[float, float], ...]]:
    """Each kind's (elements read, seconds) curve, the kinds sharing ``budget``."""
    curves = {}
    for kind, (row, run) in KINDS.items():
        share = Budget(budget.left() / (len(KINDS) - len(curves)))

        def call_of(elements: int, row: int = row, run: Callable[[torch.Tensor], torch.Tensor] = run) -> tuple[float, Maker]:
            def make() -> Callable[[], object]:
                x = torch.randn(max(1, elements // row), row, device=timer.device)
                return on_activations(lambda: run(x), x)
            return max(1, elements // row) * row, make
        curves[kind] = measured_curve(timer, share, ELEMENTS, call_of, host_s)
    return curves
