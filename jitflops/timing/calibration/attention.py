"""Fused attention: ``scaled_dot_product_attention``'s kernel, causal, with a mask, or neither; its time by FLOPs.

Timed with 12 heads of 64 on 64 to 2,048 tokens, batch 1: the work counted densely (4 x heads x
queries x keys x head_dim FLOPs), as the count gives it. A causal kernel skips the blocks above the
diagonal, and one given a mask (a causal one, as transformers makes it when traced or when padding
needs one) reads it and adds it: each has a curve of its own.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .budget import Budget, CallTimer, Maker, measured_curve

HEADS, HEAD_DIM = 12, 64
LENGTHS = (64, 128, 256, 512, 1024, 2048)


def attention_curves(timer: CallTimer, dtype: torch.dtype, budget: Budget, host_s: float) -> dict[str, tuple[tuple[float, float], ...]]:
    """The plain, the causal and the masked curve of ``dtype``, sharing ``budget``."""

    def call_of(length: int, how: str) -> tuple[float, Maker]:
        def make() -> Callable[[], object]:
            q, k, v = (torch.randn(1, HEADS, length, HEAD_DIM, device=timer.device).to(dtype) for _ in range(3))
            mask = torch.ones(length, length, dtype=torch.bool, device=timer.device).tril() if how == "masked" else None
            return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=how == "causal")
        return 4.0 * HEADS * length * length * HEAD_DIM, make
    curves = {}
    for index, how in enumerate(("attention", "causal", "masked")):
        share = Budget(budget.left() / (3 - index))
        curves[how if how == "attention" else f"{how}_attention"] = measured_curve(timer, share, LENGTHS, lambda length: call_of(length, how), host_s)
    return curves
