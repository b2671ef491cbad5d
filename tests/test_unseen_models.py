"""Models nobody here wrote: mixture-of-experts layers as transformers builds them, torch's own
transformer layers on their fused inference path, string-padded convolutions."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from torch import nn

from jitflops import ActivationCountAnalysis, FlopCountAnalysis

transformers = pytest.importorskip("transformers")

HIDDEN, EXPERT_HIDDEN, EXPERTS, TOP_K, LAYERS = 32, 16, 8, 2, 2
BATCH, SEQUENCE = 2, 5

MOE_FAMILIES = {
    "mixtral": ("MixtralConfig", dict(num_local_experts=EXPERTS, intermediate_size=EXPERT_HIDDEN, head_dim=8)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_experts=EXPERTS, moe_intermediate_size=EXPERT_HIDDEN, decoder_sparse_step=1, mlp_only_layers=[], head_dim=8)),
    "olmoe": ("OlmoeConfig", dict(num_experts=EXPERTS, intermediate_size=EXPERT_HIDDEN)),
    "gpt_oss": ("GptOssConfig", dict(num_local_experts=EXPERTS, intermediate_size=EXPERT_HIDDEN, head_dim=8, layer_types=["full_attention"] * LAYERS)),
    "deepseek_v3": ("DeepseekV3Config", dict(
        n_routed_experts=EXPERTS, moe_intermediate_size=EXPERT_HIDDEN, first_k_dense_replace=0, n_shared_experts=1, n_group=1,
        topk_group=1, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
    )),
}


def _moe_model(family: str, experts_implementation: str) -> nn.Module:
    config_class, extra = MOE_FAMILIES[family]
    config = getattr(transformers, config_class)(
        hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=4, vocab_size=64,
        num_experts_per_tok=TOP_K, **extra,
    )
    config._experts_implementation = experts_implementation
    torch.manual_seed(0)
    return transformers.AutoModel.from_config(config).eval()


@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm", "eager"])
@pytest.mark.parametrize("family", list(MOE_FAMILIES))
def test_experts_count_tokens_times_top_k_times_expert_size(family, implementation):
    """Each routed token meets ``top_k`` experts of a gate-up (2 x H x I) and a down (I x H) projection."""
    if implementation == "grouped_mm" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    model = _moe_model(family, implementation)
    ids = torch.randint(0, 64, (BATCH, SEQUENCE))
    per_layer = BATCH * SEQUENCE * TOP_K * 3 * HIDDEN * EXPERT_HIDDEN
    logging.disable(logging.WARNING)
    try:
        for backend in ("jit", "dispatch"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the eager implementation loops over the experts the router chose
                analysis = FlopCountAnalysis(model, (ids,), backend=backend)
                experts = {name: count for name, count in analysis.by_module().items() if name.endswith("mlp.experts")}
            assert experts == {f"layers.{layer}.mlp.experts": per_layer for layer in range(LAYERS)}, backend
            assert not analysis.unsupported_ops()
    finally:
        logging.disable(logging.NOTSET)


def _encoder() -> nn.Module:
    # no dropout: attention dropout in training makes torch compute the attention weights explicitly,
    # which really is another computation (more activations, the same multiply-adds)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)


def _attention_block_macs(tokens: int, length: int, model: int, hidden: int) -> dict[str, int]:
    """A hand count of one encoder layer: projections and feed-forward, attention, two layer norms."""
    return {
        "linear": tokens * (4 * model * model + 2 * model * hidden),
        "scaled_dot_product_attention": 2 * tokens * length * model,
        "layer_norm": 2 * 5 * tokens * model,
    }


@pytest.mark.parametrize("backend", ["jit", "dispatch"])
def test_fused_transformer_layers_count_in_eval_as_in_train(backend):
    """In eval without grad torch runs ``_transformer_encoder_layer_fwd``; counts match train mode."""
    model, x = _encoder(), torch.randn(3, 10, 32)
    expected = {op: 2 * count for op, count in _attention_block_macs(30, 10, 32, 64).items()}
    eval_counts = FlopCountAnalysis(model.eval(), x, backend=backend)
    assert eval_counts.total() == FlopCountAnalysis(model.train(), x, backend=backend).total() == sum(expected.values())
    if backend == "jit":  # the dispatch backend names the kernels: addmm, mm, native_layer_norm, ...
        assert eval_counts.by_operator() == expected
        kinds = {node.kind() for node in eval_counts.scoped_trace().graph.nodes()}
        assert "aten::_transformer_encoder_layer_fwd" in kinds  # the fused path was the one counted
    assert ActivationCountAnalysis(model.eval(), x, backend=backend).total() == ActivationCountAnalysis(model.train(), x, backend=backend).total()


@pytest.mark.parametrize("need_weights", [True, False])
def test_fused_multi_head_attention_counts_in_eval_as_in_train(need_weights):
    class CrossAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = nn.MultiheadAttention(32, 4, batch_first=True)

        def forward(self, query, memory):
            return self.attention(query, memory, memory, need_weights=need_weights)[0]

    model, query, memory = CrossAttention(), torch.randn(2, 6, 32), torch.randn(2, 9, 32)
    projections = (2 * 12 + 2 * 18) * 32 * 32  # query and output projections over 2 x 6 tokens; key and value over 2 x 9
    expected = projections + 2 * 2 * 6 * 9 * 32
    for backend in ("jit", "dispatch"):
        assert FlopCountAnalysis(model.eval(), (query, memory), backend=backend).total() == expected
        assert FlopCountAnalysis(model.train(), (query, memory), backend=backend).total() == expected


def test_backward_ratio_of_multi_head_attention_is_about_two():
    """Fused forward and unfused backward no longer mix: the ratio is the products' 2, not 3.1."""
    model = nn.Sequential(nn.Linear(32, 32), nn.MultiheadAttention(32, 4, batch_first=True))

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.attention = model

        def forward(self, x):
            x = self.proj(x)
            return self.attention(x, x, x, need_weights=False)[0]

    phases = FlopCountAnalysis(SelfAttention().eval(), torch.randn(2, 8, 32), backend="dispatch", backward=True).by_phase()
    assert 1.8 <= phases["backward"] / phases["forward"] <= 2.0


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_string_padded_convolutions(padding):
    model, x = nn.Conv2d(3, 8, 3, padding=padding), torch.randn(2, 3, 10, 10)
    positions = 100 if padding == "same" else 64
    for backend in ("jit", "dispatch"):
        assert FlopCountAnalysis(model, x, backend=backend).by_operator() == {"conv": 2 * 8 * 27 * positions}
