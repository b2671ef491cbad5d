"""The host's time per eager call, by kind: what a forward spends before (a GPU) or besides (a CPU)
its kernels.

Timed as the median per call of a loop of many: a tiny op that dispatches a kernel (``torch.add``
of two one-element tensors: Python, the dispatcher and an allocation), a view (``view``), a read of
a size (``size(0)``), a call of a module that does nothing (``nn.Module.__call__``'s machinery),
and the backward of a chain of tiny products (the autograd engine's call of each backward op).
On a GPU the loop is synchronised once at its end: each op's time is what the host takes to issue
it, where the kernel is tinier than that.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
from torch import nn

from .budget import synchronize

CALLS = 2000
"""Calls per timed loop; the median of 5 loops is taken."""


def _per_call(device: torch.device, run: Callable[[], object]) -> float:
    for _ in range(100):
        run()
    samples = []
    for _ in range(5):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(CALLS):
            run()
        synchronize(device)
        samples.append((time.perf_counter() - start) / CALLS)
    return statistics.median(samples)


BACKWARD_CHAIN = 200
"""Tiny ops in the chain whose backward times the autograd engine's call of a backward op."""


def _backward_per_op(device: torch.device) -> float:
    leaf = torch.ones(1, device=device, requires_grad=True)

    def chain() -> torch.Tensor:
        x = leaf
        for _ in range(BACKWARD_CHAIN):
            x = x * 1.0
        return x.sum()
    samples = []
    for _ in range(5):
        loss = chain()
        synchronize(device)
        start = time.perf_counter()
        loss.backward()
        synchronize(device)
        samples.append((time.perf_counter() - start) / (BACKWARD_CHAIN + 1))
    return statistics.median(samples)


def host_seconds(device: torch.device) -> dict[str, float]:
    """Seconds per call of each kind (:data:`~jitflops.estimates.devices.HOST_KINDS`)."""
    a, b = torch.ones(1, device=device), torch.ones(1, device=device)
    identity = nn.Identity()
    op = _per_call(device, lambda: torch.add(a, b))
    return {"op": op, "view": _per_call(device, lambda: a.view(1)), "scalar": _per_call(device, lambda: a.size(0)),
            "module": _per_call(device, lambda: identity(a)), "backward": _backward_per_op(device)}
