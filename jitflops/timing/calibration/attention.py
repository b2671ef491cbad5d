"""Fused attention: ``scaled_dot_product_attention``'s kernel, causal, with a mask, or neither; its time by FLOPs.

Timed with 12 heads of 64 on 64 to 2,048 tokens, batch 1: the work counted densely (4 x heads x
queries x keys x head_dim FLOPs), as the count gives it. A causal kernel skips the blocks above the
diagonal, and one given a mask (a causal one, as transformers makes it when traced or when padding
needs one) reads it and adds it: each has a curve of its own. A decode step's attention, one query
over the cache's keys, has one too, timed on 64 to 2,048 keys: it reads the keys and values for
four FLOPs an element, bound by memory where the square ones are bound by compute.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .budget import Budget, CallTimer, Maker, measured_curve

HEADS, HEAD_DIM = 12, 64
LENGTHS = (64, 128, 256, 512, 1024, 2048)
DECODE_KEYS = (64, 256, 1024, 2048)
"""Keys one query attends to in the decode points."""


def attention_curves(timer: CallTimer, dtype: torch.dtype, budget: Budget, host_s: float) -> dict[str, tuple[tuple[float, float], ...]]:
    """The plain, the causal, the masked and the decode curve of ``dtype``, sharing ``budget``."""

    def call_of(size: tuple[int, int], how: str) -> tuple[float, Maker]:
        queries, keys = size

        def make() -> Callable[[], object]:
            q = torch.randn(1, HEADS, queries, HEAD_DIM, device=timer.device).to(dtype)
            k, v = (torch.randn(1, HEADS, keys, HEAD_DIM, device=timer.device).to(dtype) for _ in range(2))
            mask = torch.ones(queries, keys, dtype=torch.bool, device=timer.device).tril() if how == "masked" else None
            return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=how == "causal")
        return 4.0 * HEADS * queries * keys * HEAD_DIM, make
    curves = {}
    for index, how in enumerate(("attention", "causal", "masked", "decode")):
        share = Budget(budget.left() / (4 - index))
        sizes = [(1, keys) for keys in DECODE_KEYS] if how == "decode" else [(length, length) for length in LENGTHS]
        curves[how if how == "attention" else f"{how}_attention"] = measured_curve(timer, share, sizes, lambda size: call_of(size, how), host_s)
    return curves
