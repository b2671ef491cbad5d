"""Gathers: an embedding's rows; their time by the elements they write.

A gather reads the rows it returns from a table much larger than the caches (a vocabulary of
32,000 rows of 768 here), at random places: timed by the elements of its output.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .budget import Budget, CallTimer, Maker, measured_curve

WIDTH, ROWS = 768, 32000
TOKENS = (1, 8, 64, 512, 4096)


def gather_curve(timer: CallTimer, budget: Budget, host_s: float) -> tuple[tuple[float, float], ...]:
    """(elements written, seconds) of embedding lookups of 1 to 4,096 tokens."""
    table = torch.randn(ROWS, WIDTH, device=timer.device)

    def call_of(tokens: int) -> tuple[float, Maker]:
        def make() -> Callable[[], object]:
            ids = torch.randint(0, ROWS, (tokens,), device=timer.device)
            return lambda: F.embedding(ids, table)
        return tokens * WIDTH, make
    return measured_curve(timer, budget, TOKENS, call_of, host_s)
