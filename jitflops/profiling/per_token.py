"""FLOPs per token of a language model, counted and by the analytic formulas people compare with.

Training budgets and MFU are quoted in FLOPs per token, estimated by formulas of the model's
sizes. :func:`flops_per_token` counts them instead; :func:`analytic_flops_per_token` gives the
formulas' values for the same model, so that a count and a formula can be told apart term by
term (the README's table, ``tools/analytic_formulas.py``). All figures are training FLOPs per
token (forward and backward, the backward twice the forward, as every formula here assumes), with
one multiply-accumulate = 2 FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass
import torch
from torch import nn

from ..engine.flop_count import FlopCountAnalysis

TRAINING_PASSES = 3
"""Forward + backward, the backward counted as twice the forward (each formula's assumption)."""


def flops_per_token(model: nn.Module, seq_len: int, batch: int = 1, training: bool = True) -> float:
    """Training (or, ``training=False``, forward) FLOPs per token of a causal language model on
    ``batch`` sequences of ``seq_len`` tokens: its forward counted (attention dense, embeddings a
    lookup, elementwise work not counted), times :data:`TRAINING_PASSES` for training. Works on the
    meta device."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    ids = torch.zeros(batch, seq_len, dtype=torch.long, device=device)
    macs = FlopCountAnalysis(model, ids).unsupported_ops_warnings(False).uncalled_modules_warnings(False).total()
    return 2 * macs * (TRAINING_PASSES if training else 1) / (batch * seq_len)


@dataclass(frozen=True)
class LanguageModelSizes:
    """What the analytic formulas read of a model: active parameters without the input embedding
    (a mixture of experts' shared weights, router and its top-k experts), layers, width, query
    heads and their dimension, the vocabulary."""

    active_params: int
    layers: int
    hidden: int
    heads: int
    head_dim: int
    vocab: int


def analytic_flops_per_token(sizes: LanguageModelSizes, seq_len: int) -> dict[str, float]:
    """Training FLOPs per token by the formulas people quote:

    * ``6N``: 6 x the active parameters (Kaplan et al. 2020, the context term left out);
    * ``kaplan``: 3 x Kaplan's forward ``2N + 2 n_layer n_ctx d_attn``;
    * ``megatron``: Narayanan et al. 2021 without recomputation, ``72 l h^2 (1 + s/6h + V/12lh)``
      per token (a GPT layer: 4h^2 in attention projections and an 8h^2 MLP);
    * ``torchtitan``: ``6N + 12 l h q t`` (heads h of dimension q, sequence t).
    """
    n, l, h, t = sizes.active_params, sizes.layers, sizes.hidden, seq_len
    d_attn = sizes.heads * sizes.head_dim
    return {
        "6N": 6 * n,
        "kaplan": TRAINING_PASSES * (2 * n + 2 * l * t * d_attn),
        "megatron": 72 * l * h * h * (1 + t / (6 * h) + sizes.vocab / (12 * l * h)),
        "torchtitan": 6 * n + 12 * l * sizes.heads * sizes.head_dim * t,
    }
