"""FLOPs per token against the analytic formulas, term by term, on small configurations of the
architectures docs/conventions.md's table covers (the table itself: ``tools/analytic_formulas.py``)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

from jitflops import LanguageModelSizes, analytic_flops_per_token, flops_per_token

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
import analytic_formulas  # noqa: E402

SEQ = 64


def _norm_weights(model: torch.nn.Module) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if "norm" in name)


@pytest.mark.parametrize("model_type, sizes", [
    ("llama", dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=100)),
    ("mixtral", dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     vocab_size=100, num_local_experts=4, num_experts_per_tok=2)),
], ids=["llama", "mixtral"])
def test_a_count_is_torchtitans_formula_but_the_norm_weights(model_type, sizes):
    """Dense attention, products of every active weight but the norms' (elementwise): jitflops gives
    6N + 12 l h q t less 6 x the norm weights, and Kaplan's formula half of the attention less."""
    model = analytic_formulas.build(model_type, sizes)
    config = model.config
    experts = getattr(config, "num_local_experts", 1)
    active = analytic_formulas.active_parameters(model, experts, getattr(config, "num_experts_per_tok", 1) if experts > 1 else 1)
    model_sizes = LanguageModelSizes(active, 2, 64, 4, 16, 100)
    formulas = analytic_flops_per_token(model_sizes, SEQ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        counted = flops_per_token(model, SEQ)
    assert counted == pytest.approx(formulas["torchtitan"] - 6 * _norm_weights(model), rel=1e-12)
    attention = 12 * 2 * 4 * 16 * SEQ  # 3 passes x 2 FLOPs x 2 products x layers x heads x head dim x positions
    assert formulas["torchtitan"] - formulas["6N"] == attention and formulas["torchtitan"] - formulas["kaplan"] == attention / 2
    assert flops_per_token(model, SEQ, training=False) == pytest.approx(counted / 3)


def test_deepseek_v3s_attention_reads_values_of_a_narrower_head():
    """Multi-head latent attention: query and key heads of 192, value heads of 128; torchtitan's
    12 l h q t charges the value product at 192 too."""
    sizes = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2, first_k_dense_replace=1,
                 num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                 q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, vocab_size=100, n_group=1, topk_group=1)
    model = analytic_formulas.build("deepseek_v3", sizes)
    active = analytic_formulas.active_parameters(model, 4, 2)
    formulas = analytic_flops_per_token(LanguageModelSizes(active, 2, 64, 4, 24, 100), SEQ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        counted = flops_per_token(model, SEQ)
    narrower_values = 6 * 2 * 4 * SEQ * (24 - 16)  # 3 passes x 2 FLOPs x layers x heads x positions x (q - v head dim)
    assert counted == pytest.approx(formulas["torchtitan"] - narrower_values - 6 * _norm_weights(model), rel=1e-12)
