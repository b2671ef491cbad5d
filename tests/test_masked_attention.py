"""The mask-aware attention convention beside the dense one: causal, sliding-window and padding
masks, against hand counts of the (query, key) pairs each keeps."""

from __future__ import annotations

import itertools
import logging
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from jitflops import FlopCountAnalysis, format_model_profile, profile_model
from jitflops.reports.files import profile_to_dict
from jitflops.handles.attention import causal_pairs

B, H, E = 2, 4, 16


class _Attention(nn.Module):
    def forward(self, q, k, v, mask=None, causal=False):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


def _qkv(target: int, source: int):
    return torch.randn(B, H, target, E), torch.randn(B, H, source, E), torch.randn(B, H, source, E)


def _counts(inputs, backend):
    dense = FlopCountAnalysis(_Attention(), inputs, backend=backend).total()
    masked = FlopCountAnalysis(_Attention(), inputs, backend=backend, attention="masked").total()
    return dense, masked


@pytest.mark.parametrize("backend", ["jit", "dispatch"])
@pytest.mark.parametrize("target, source", [(8, 8), (4, 8)])
def test_causal_masks_keep_the_lower_triangle(backend, target, source):
    dense, masked = _counts((*_qkv(target, source), None, True), backend)
    assert dense == B * H * target * source * 2 * E
    kept = sum(min(i + 1, source) for i in range(target))  # torch's is_causal: query i sees keys 0..i
    assert causal_pairs(target, source) == kept and masked == B * H * kept * 2 * E
    if target == source:
        assert kept == target * (target + 1) // 2


def test_a_sliding_window_mask_keeps_its_band_where_the_values_are_read():
    length, window = 16, 4
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    band = (j <= i) & (j > i - window)  # each query sees itself and the 3 keys before it
    inputs = (*_qkv(length, length), band)
    dense, masked = _counts(inputs, "dispatch")
    kept = int(band.sum())
    assert kept == window * length - window * (window - 1) // 2
    assert masked == B * H * kept * 2 * E and dense == B * H * length * length * 2 * E
    additive = torch.zeros(length, length).masked_fill(~band, float("-inf"))  # the same band as an additive mask
    assert _counts((*_qkv(length, length), additive), "dispatch")[1] == masked
    assert _counts(inputs, "jit") == (dense, masked)  # the JIT's masks, read by one eager run


@pytest.fixture
def llama():
    transformers = pytest.importorskip("transformers")
    logging.disable(logging.WARNING)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100)
    model = transformers.LlamaForCausalLM(config).eval()
    model.config._attn_implementation = "sdpa"
    yield model
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_a_hugging_face_model_causal_and_padded(llama, implementation):
    """Both attention paths of a Hugging Face model: SDPA (its causal flag, or its mask read as it
    ran) and eager attention (products and a softmax: the mask read where the softmax takes it)."""
    llama.config._attn_implementation = implementation
    ids = torch.randint(0, 100, (2, 8))
    padding = torch.ones(2, 8, dtype=torch.long)
    padding[1, :3] = 0  # the second sequence is left-padded by 3
    attention = 1 * H * 2 * 16  # per kept (query, key) pair: 1 layer, 4 query heads, q @ k^T and weights @ v of 16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inputs = {"input_ids": ids, "attention_mask": padding}
        for backend in ("jit", "dispatch"):
            # no padding: SDPA's causal flag, or eager attention's causal mask
            dense = FlopCountAnalysis(llama, {"input_ids": ids}, backend=backend).total()
            masked = FlopCountAnalysis(llama, {"input_ids": ids}, backend=backend, attention="masked").total()
            assert dense - masked == 2 * (64 - 36) * attention, backend
            dense = FlopCountAnalysis(llama, inputs, backend=backend).total()
            masked = FlopCountAnalysis(llama, inputs, backend=backend, attention="masked").total()
            # the first sequence keeps 36 pairs; in the second, padded keys are dropped for every
            # query and padded queries see nothing: queries 3..7 see 1..5 keys
            assert dense - masked == (2 * 64 - (36 + 15)) * attention, backend
        profile = profile_model(llama, inputs, timed=False, backend="dispatch")
    assert profile.summary.masked_out_macs == dense - masked and profile.summary.macs == dense
    assert "its masks discard" in format_model_profile(profile)
    assert profile_to_dict(profile)["summary"]["masked_out_macs"] == dense - masked
    assert profile.root.find("model.layers.0.self_attn").masked_out_macs == dense - masked


def _decoder(name: str):
    """Two-layer decoders of the issue's table: Llama with GQA 3 (6 heads, 2 KV heads, head 12),
    GPT-2 (4 heads of 16) and Qwen2 with GQA 2; SDPA, transformers' default."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = {
        "llama": lambda: transformers.LlamaConfig(hidden_size=72, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, vocab_size=100),
        "gpt2": lambda: transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100, n_positions=64),
        "qwen2": lambda: transformers.Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=100),
    }[name]()
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    return model, 2 * config.num_attention_heads * 2 * (config.hidden_size // config.num_attention_heads)


@pytest.mark.parametrize("name", ["llama", "gpt2", "qwen2"])
@pytest.mark.parametrize("mask", ["none", "all ones", "left padded"])
def test_decoders_under_sdpa_keep_their_causal_mask_under_both_front_ends(name, mask):
    """transformers passes ``is_causal=True`` and no mask where no padding is needed, but
    materialises the causal mask under the JIT tracer: the JIT's mask-aware count takes the causal
    pairs from the eager run all the same (it counted dense before), equal to the dispatch
    backend's and to the hand count of kept (query, key) pairs, padded rows included."""
    model, per_pair = _decoder(name)  # MACs per kept pair: 2 layers x heads x (q @ k^T + weights @ v)
    length, padding = 37, [0, 5, 11]
    ids = torch.randint(0, 100, (3, length))
    inputs = {"input_ids": ids}
    if mask != "none":
        inputs["attention_mask"] = torch.ones_like(ids)
    if mask == "left padded":
        for row, padded in enumerate(padding):
            inputs["attention_mask"][row, :padded] = 0
    kept = sum(causal_pairs(length - padded, length - padded) for padded in (padding if mask == "left padded" else [0, 0, 0]))
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dense = FlopCountAnalysis(model, inputs).total()
            counts = {backend: FlopCountAnalysis(model, inputs, backend=backend, attention="masked").total() for backend in ("jit", "dispatch")}
    finally:
        logging.disable(logging.NOTSET)
    assert counts == dict.fromkeys(("jit", "dispatch"), dense - (3 * length * length - kept) * per_pair)


class _EagerAttention(nn.Module):
    """Attention written out: a scaled scores product, an additive mask, softmax, dropout, weights product."""

    def forward(self, q, k, v, mask):
        scores = torch.matmul(q, k.transpose(-2, -1)) / E**0.5
        weights = F.dropout(torch.softmax(scores + mask, dim=-1), p=0.1, training=self.training)
        return torch.matmul(weights, v) @ torch.ones(E, 3)  # a product after attention: counted dense


def test_eager_attention_counts_both_products_by_the_scores_its_mask_keeps():
    length, window = 12, 3
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    band = (j <= i) & (j > i - window)
    mask = torch.zeros(length, length).masked_fill(~band, torch.finfo(torch.float32).min)
    q, k, v = _qkv(length, length)
    kept = int(band.sum())
    tail = B * H * length * E * 3
    for model, backend in itertools.product((_EagerAttention().eval(), _EagerAttention().train()), ("jit", "dispatch")):  # dropout's zeros are not the mask's
        dense = FlopCountAnalysis(model, (q, k, v, mask), backend=backend).total()
        masked = FlopCountAnalysis(model, (q, k, v, mask), backend=backend, attention="masked").total()
        assert dense == B * H * length * length * 2 * E + tail
        assert masked == B * H * kept * 2 * E + tail
        assert masked - tail == _counts((q, k, v, band), "dispatch")[1]  # what SDPA counts with the same mask
    unmasked = FlopCountAnalysis(_EagerAttention(), (q, k, v, torch.zeros(length, length)), backend="dispatch", attention="masked")
    assert unmasked.total() == B * H * length * length * 2 * E + tail  # a mask that keeps everything


def test_mfu_counts_model_flops_and_hfu_the_dense_work():
    """PaLM's definitions: MFU over the model's FLOPs (the work the causal mask discards left out),
    HFU over what the hardware ran (the dense count)."""
    q, k, v = _qkv(8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profile = profile_model(_Attention(), (q, k, v, None, True), repeats=2, peak_flops=1e12)
    summary = profile.summary
    dense = 2 * B * H * 8 * 8 * 2 * E  # FLOPs of the two products
    discarded = 2 * B * H * (64 - 36) * 2 * E
    assert summary.flops == dense and 2 * summary.masked_out_macs == discarded
    work, seconds = summary.measured_work
    assert work == dense and summary.model_flops == dense - discarded
    assert summary.mfu == pytest.approx((dense - discarded) / seconds / 1e12)
    assert summary.hfu == pytest.approx(dense / seconds / 1e12)
    printed = format_model_profile(profile)
    assert "MFU = model FLOPS (masked-out attention left out) per GPU" in printed and "HFU = " in printed
    exported = profile_to_dict(profile)
    assert exported["summary"]["model_flops"] == dense - discarded
    assert exported["modules"][0]["mfu"] == pytest.approx((dense - discarded) / profile.root.latency.median / 1e12)


def test_flex_attention_counts_the_blocks_its_mask_keeps():
    """``flex_attention``: dense by default, as SDPA; mask-aware, the (query, key) pairs inside the
    blocks the block mask keeps (what a block-sparse kernel computes), blocks at the ends partial.
    Torch's JIT cannot trace it: the default call counts it by dispatch."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    import torch.nn.attention.flex_attention  # noqa: F401  (the module, for its debug switch below)

    def causal(b, h, q, kv):
        return q >= kv

    def window(b, h, q, kv):
        return (q >= kv) & (q - kv < 64)

    cases = [
        (causal, 200, 128, 128 * 128 + 72 * (128 + 72)),  # query block 0 keeps key block 0; block 1 (72 rows) both
        (window, 256, 64, (1 + 2 * 3) * 64 * 64),  # each query block keeps its own key block and the one before
    ]
    for mask_mod, length, block, kept in cases:
        block_mask = flex.create_block_mask(mask_mod, None, None, length, length, device="cpu", BLOCK_SIZE=block)

        class Flex(nn.Module):
            def forward(self, q, k, v):
                return flex.flex_attention(q, k, v, block_mask=block_mask)

        inputs = _qkv(length, length)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dense = FlopCountAnalysis(Flex(), inputs)
            masked = FlopCountAnalysis(Flex(), inputs, attention="masked")
            assert dense.counted_by == "dispatch" and dense.unsupported_ops() == {}
            assert dense.total() == B * H * length * length * 2 * E == _counts((*inputs, None), "dispatch")[0]
            assert masked.total() == B * H * kept * 2 * E
    assert torch.nn.attention.flex_attention._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG is False  # put back


def test_the_table_shows_both_conventions_side_by_side():
    from jitflops import flop_count_table

    class Projected(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(E, E)

        def forward(self, x):
            q = self.q(x).view(B, 8, H, E // H).transpose(1, 2)
            return F.scaled_dot_product_attention(q, q, q, is_causal=True)

    table = flop_count_table(FlopCountAnalysis(Projected(), torch.randn(B, 8, E)), masked_attention=True)
    linear = B * 8 * E * E
    dense, kept = B * H * 64 * 2 * (E // H), B * H * 36 * 2 * (E // H)  # 64 pairs, 36 of them causal
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[3:5]] for line in table.splitlines() if line.startswith("| ")}
    assert rows["model"] == [f"{(linear + dense) / 1e3:g}K", f"{(linear + kept) / 1e3:g}K"]
    assert rows["q"] == [f"{linear / 1e3:g}K"] * 2
    assert table.rstrip().endswith("#flops (masks followed): attention by the pairs its masks keep")


@pytest.mark.parametrize("backend", ["jit", "dispatch"])
def test_chunked_and_packed_masks_keep_each_chunk_causal(backend):
    """Chunked local attention (Llama 4's) and packed sequences (a document mask) are both a
    block-diagonal causal mask: query i sees the keys of its own chunk up to itself. Held for SDPA
    with the mask and for eager attention with it added to the scores."""
    length, chunk = 12, 4
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    chunks = (i // chunk == j // chunk) & (j <= i)
    kept = (length // chunk) * chunk * (chunk + 1) // 2  # 3 chunks of 4 queries: 1 + 2 + 3 + 4 keys each
    assert kept == int(chunks.sum()) == 30
    q, k, v = _qkv(length, length)
    sdpa = FlopCountAnalysis(_Attention(), (q, k, v, chunks), backend=backend, attention="masked").total()
    assert sdpa == B * H * kept * 2 * E
    additive = torch.zeros(length, length).masked_fill(~chunks, float("-inf"))
    eager = FlopCountAnalysis(_EagerAttention(), (q, k, v, additive), backend=backend, attention="masked").total()
    assert eager == sdpa + B * H * length * E * 3  # the product after attention, dense
