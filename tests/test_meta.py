"""Very large models counted on the meta device, without allocating their memory."""

from __future__ import annotations

import resource

import pytest
import torch

from jitflops import FlopCountAnalysis
from jitflops.examples import ZOO

pytest.importorskip("transformers")


def test_llama3_8b_on_meta_matches_the_hand_derived_count():
    hidden, layers, heads, kv_heads, ffn, vocab, tokens = 4096, 32, 32, 8, 14336, 128256, 2048
    model, args, kwargs = ZOO["llama-8b"].instantiate("meta")
    parameters = sum(p.numel() for p in model.parameters())
    head_dim = hidden // heads
    per_layer = 2 * hidden * hidden + 2 * hidden * head_dim * kv_heads + 3 * hidden * ffn + 2 * hidden
    assert parameters == 2 * vocab * hidden + layers * per_layer + hidden > 7e9
    analysis = FlopCountAnalysis(model, args, kwargs)
    linear_weights = layers * (per_layer - 2 * hidden) + vocab * hidden  # every matrix but the embedding
    attention = layers * heads * tokens * tokens * 2 * head_dim
    assert analysis.by_operator() == {"linear": tokens * linear_weights, "scaled_dot_product_attention": attention}
    assert analysis.unsupported_ops() == {}
    assert analysis.total("model.layers.0.self_attn") == tokens * (2 * hidden * hidden + 2 * hidden * head_dim * kv_heads) + attention // layers
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 * 1024 * 1024  # KiB: far below the 32 GB of its weights


def test_a_meta_trace_leaves_fake_tensor_convolutions_working():
    """A meta trace swaps in jitflops' meta kernel for ``aten::convolution`` and removes it after,
    yet a FakeTensorMode that meets its first convolution after it still reaches that kernel (torch
    2.11 and 2.13). On torch 2.11 it then failed in ``convolution_overrideable``: ``memory_footprint``
    of every convolutional model, after a count on meta values, in the same process (found by
    tools/gpu_check.py on an H100). Run alone (``-k``) on torch 2.11, this fails without the fix.
    The estimate after the trace is checked against torch's MemTracker of the same forward."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from jitflops import memory_footprint
    from jitflops.examples import all_examples

    model, args, kwargs = all_examples()["convnet"].instantiate("cpu")
    assert FlopCountAnalysis(*all_examples()["convnet"].instantiate("meta")).total() == FlopCountAnalysis(model, args, kwargs).total()
    estimate = memory_footprint(model, args, kwargs).peak
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker, torch.no_grad():
        model(*args, **kwargs)
    measured = next(peak["Total"] for where, peak in tracker.get_tracker_snapshot("peak").items() if where.type == "cpu")
    assert estimate == measured + sum(t.untyped_storage().nbytes() for t in args)


def _meta_causal_lm(model_type: str, dtype: torch.dtype = torch.float32, **sizes: int) -> torch.nn.Module:
    """A transformers causal language model of ``sizes``, built on the meta device (no memory)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(model_type, **sizes)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def _calls(tokens: int) -> dict[str, dict[str, object]]:
    """The calls users make, on meta inputs: the tokens alone, and with what a training or an
    evaluation loop passes (transformers' mask code takes another path for each)."""
    ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
    return {
        "the tokens alone": {"input_ids": ids},
        "use_cache=False": {"input_ids": ids, "use_cache": False},
        "an all-ones attention_mask": {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
        "labels": {"input_ids": ids, "labels": ids},
    }


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.fixture(scope="module")
def gpt2() -> torch.nn.Module:
    return _meta_causal_lm("gpt2", n_positions=8192)


@pytest.mark.parametrize("call", list(_calls(1)))
@pytest.mark.parametrize("tokens", [1024, 8192])
def test_gpt2_on_meta_with_the_usual_calls_matches_megatrons_forward_formula(gpt2, tokens, call):
    """GPT-2 (124M) on meta at 1,024 and 8,192 tokens: Megatron's forward, 12·s·l·h²·(1 + s/6h) +
    s·h·V MACs (its 72·l·h²·(...) training FLOPs per token, over 3 passes and 2 FLOPs a MAC), within
    0.5% (jitflops counts the layer norms too). ``use_cache=False`` and an all-ones mask failed on
    meta (transformers reads those masks' values unless traced), and the fallback fed the model
    uninitialised integers."""
    layers, hidden, vocab = 12, 768, 50257
    megatron = 12 * tokens * layers * hidden**2 * (1 + tokens / (6 * hidden)) + tokens * hidden * vocab
    analysis = FlopCountAnalysis(gpt2, (), _calls(tokens)[call])
    assert analysis.total() == pytest.approx(megatron, rel=0.005)
    assert analysis.unsupported_ops() == {} and analysis.counted_by == "jit"


@pytest.mark.parametrize("call", list(_calls(1)))
def test_the_dispatch_backend_and_a_profile_count_a_meta_model_with_the_usual_calls(gpt2, call):
    """The dispatch backend on meta, forward and (given labels) backward, with the calls users make:
    Megatron's forward as above, and the backward twice it (its 3 passes), plus the scores the CPU's
    flash kernel recomputes in its backward (s²·h a layer), as the CPU counts it. An all-ones mask failed
    there: transformers reads a mask's values to drop it where it masks nothing, and a meta tensor
    has none; it is recorded on the path the JIT's count takes (the traced one), which reads none.
    A profile of the meta model (timed by default) counts it and times nothing, as does DeepSpeed's
    ``get_model_profile``."""
    from jitflops import get_model_profile, profile_model

    tokens, layers, hidden, vocab = 1024, 12, 768, 50257
    megatron = 12 * tokens * layers * hidden**2 * (1 + tokens / (6 * hidden)) + tokens * hidden * vocab
    kwargs = _calls(tokens)[call]
    forward = FlopCountAnalysis(gpt2, (), kwargs, backend="dispatch").unsupported_ops_warnings(False)
    assert forward.total() == pytest.approx(megatron, rel=0.005) and forward.counted_by == "dispatch"
    if "labels" in kwargs:
        step = FlopCountAnalysis(gpt2, (), kwargs, backend="dispatch", backward=True).unsupported_ops_warnings(False)
        assert step.total() == pytest.approx(3 * megatron + layers * tokens**2 * hidden, rel=0.001)
    profile = profile_model(gpt2, (), kwargs, device="h100")
    assert profile.root.latency is None and profile.summary.forward is None
    counted = FlopCountAnalysis(gpt2, (), kwargs).total()  # multiply-adds
    assert profile.root.flops == 2 * counted and profile.root.predicted_s > 0
    flops, macs, parameters = get_model_profile(gpt2, kwargs=kwargs, print_profile=False, as_string=False)
    assert (flops, macs) == (2 * counted, counted) and parameters == sum(p.numel() for p in gpt2.parameters())


def _llama_hand_count(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int, tokens: int) -> dict[str, int]:
    head_dim = hidden // heads
    per_layer = 2 * hidden * hidden + 2 * hidden * head_dim * kv_heads + 3 * hidden * ffn
    return {"linear": tokens * (layers * per_layer + vocab * hidden), "scaled_dot_product_attention": layers * heads * tokens * tokens * 2 * head_dim}


@pytest.mark.parametrize("name, sizes, calls", [
    ("Llama-2-7B", dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
     ["the tokens alone", "use_cache=False", "an all-ones attention_mask", "labels"]),
    ("Llama-3-70B", dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, vocab_size=128256),
     ["use_cache=False", "an all-ones attention_mask", "labels"]),
])
def test_a_llama_on_meta_with_the_usual_calls_matches_the_hand_count(name, sizes, calls):
    """The README's scale, with the calls users make: no memory allocated (a copy of the 70B model
    on the CPU would need 280 GB), the counts by hand."""
    model = _meta_causal_lm("llama", **sizes)
    expected = _llama_hand_count(sizes["hidden_size"], sizes["num_hidden_layers"], sizes["num_attention_heads"], sizes["num_key_value_heads"],
                                 sizes["intermediate_size"], sizes["vocab_size"], 4096)
    for call in calls:
        analysis = FlopCountAnalysis(model, (), _calls(4096)[call])
        assert analysis.by_operator() == expected, call
        assert analysis.unsupported_ops() == {}, call
    assert _rss_mib() < 4096


def test_deepseek_v3_on_meta_with_the_usual_calls_counts_its_routed_experts_exactly():
    """The published DeepSeek-V3 configuration (671B, bfloat16) at 4,096 tokens: its 58 MoE
    layers' routed experts are top-8 of 256, each three products of 7,168 by 2,048, exactly."""
    sizes = dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61, first_k_dense_replace=3,
                 num_attention_heads=128, num_key_value_heads=128, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
                 q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, vocab_size=129280)
    model = _meta_causal_lm("deepseek_v3", torch.bfloat16, **sizes)
    assert sum(p.numel() for p in model.parameters()) > 671e9
    calls = _calls(4096)
    totals = set()
    for call in ("use_cache=False", "labels"):
        analysis = FlopCountAnalysis(model, (), calls[call])
        assert analysis.by_operator()["_grouped_mm"] == 58 * 4096 * 8 * 3 * 7168 * 2048, call
        assert analysis.unsupported_ops() == {}, call
        totals.add(analysis.total())
    assert len(totals) == 1
    assert _rss_mib() < 4096


def _vit_and_bert_by_hand(layers: int = 2, hidden: int = 64, ffn: int = 128, labels: int = 3) -> dict[str, tuple[type, object, dict, int]]:
    """A ViT and a BERT classifier, their inputs made on the CPU as users make them (``labels``
    included), and their MACs by hand: the products of every layer (4·h² + 2·h·ffn a token), the
    attention's two (2·t²·h), fvcore's 5 a value for each layer norm, ViT's patch convolution, BERT's
    pooler and both classifiers."""
    transformers = pytest.importorskip("transformers")
    sizes = dict(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=ffn, num_attention_heads=2, num_labels=labels)

    def body(tokens: int) -> int:
        return layers * (tokens * (4 * hidden**2 + 2 * hidden * ffn) + 2 * tokens**2 * hidden) + (2 * layers + 1) * tokens * hidden * 5

    ids = torch.randint(0, 100, (2, 16))
    bert_call = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids), "labels": torch.tensor([0, 2])}
    return {
        "ViT": (transformers.ViTForImageClassification, transformers.ViTConfig(**sizes), {"pixel_values": torch.randn(2, 3, 224, 224), "labels": torch.tensor([0, 2])},
                2 * (196 * 3 * 16 * 16 * hidden + body(197) + hidden * labels)),
        "BERT": (transformers.BertForSequenceClassification, transformers.BertConfig(**sizes), bert_call, 2 * (body(16) + hidden**2 + hidden * labels)),
    }


@pytest.mark.parametrize("built", ["torch.device('meta')", "init_empty_weights()"])
@pytest.mark.parametrize("family", ["ViT", "BERT"])
def test_a_model_built_on_meta_is_counted_on_inputs_made_on_the_cpu(family, built):
    """A model built on meta (``torch.device("meta")``, or accelerate's ``init_empty_weights``, which
    leaves the buffers on the CPU) called with inputs from ``torch.randn`` and ``torch.randint``: its
    forward mixed the devices and every front end failed ("Tensor on device cpu is not on the
    expected device meta!" in ViT's patch convolution, in BERT's loss over the CPU labels). The inputs
    go to the model's meta device; the counts equal the hand count, under both backends and in a
    profile, whose statistics share one recording, and the activations the CPU model's."""
    from jitflops import ActivationCountAnalysis, profile_model

    accelerate = pytest.importorskip("accelerate")
    model_class, config, call, by_hand = _vit_and_bert_by_hand()[family]
    with torch.device("meta") if built.startswith("torch") else accelerate.init_empty_weights():
        model = model_class(config).eval()
    assert all(p.is_meta for p in model.parameters()) and not any(t.is_meta for t in call.values())
    for backend in ("jit", "dispatch"):
        assert FlopCountAnalysis(model, (), call, backend=backend).total() == by_hand, backend
    assert profile_model(model, (), call, device="h100").root.flops == 2 * by_hand
    assert ActivationCountAnalysis(model, (), call).by_operator() == ActivationCountAnalysis(model_class(config).eval(), (), call).by_operator()  # the CPU's, fvcore's parity
    assert not any(t.is_meta for t in call.values())  # the user's inputs stay where they were


@pytest.mark.parametrize("family", ["GPT-2", "Llama", "T5"])
def test_ties_that_init_empty_weights_broke_are_counted_once(family):
    """accelerate's ``init_empty_weights`` wraps each parameter it registers in a new Parameter, so a
    tie made by assignment (transformers' head and embeddings) leaves two Parameters over one meta
    storage. Each count saw two: a tied Llama of a 1,000-token vocabulary had 202,048 parameters for
    its 138,048, its AdamW step 3,745,300 bytes for 2,793,240; T5's table, four times over. Every count now
    equals the CPU-built model's (torch's ``parameters()``, which holds the tie), and the user's
    model keeps its Parameters."""
    from jitflops import FlopsProfiler, get_model_profile, memory_footprint, parameter_count

    accelerate = pytest.importorskip("accelerate")
    transformers = pytest.importorskip("transformers")
    config, copies = {
        "GPT-2": (transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000), 1),  # the head
        "Llama": (transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                                           vocab_size=1000, tie_word_embeddings=True), 1),
        "T5": (transformers.T5Config(num_layers=2, d_model=64, d_ff=128, num_heads=4, d_kv=16, vocab_size=1000, decoder_start_token_id=0), 3),  # both embeddings and the head
    }[family]
    ids = torch.randint(0, 1000, (2, 8))
    call = {"input_ids": ids, "labels": ids}
    model_class = transformers.T5ForConditionalGeneration if family == "T5" else transformers.AutoModelForCausalLM.from_config
    cpu = model_class(config)
    with accelerate.init_empty_weights():
        model = model_class(config)
    untied = sum(p.numel() for p in model.parameters())
    tied = sum(p.numel() for p in cpu.parameters())
    assert untied == tied + copies * 1000 * 64  # the table counted again by torch itself
    assert parameter_count(model)[""] == tied
    assert get_model_profile(model, kwargs=call, print_profile=False, as_string=False)[2] == tied
    profiler = FlopsProfiler(model)
    profiler.start_profile()
    model(**{name: t.to("meta") for name, t in call.items()})
    assert profiler.get_total_params() == tied == model.__params__
    profiler.end_profile()
    assert memory_footprint(model, (), call, train="adamw").needed() == memory_footprint(cpu, (), call, train="adamw").needed()
    assert sum(p.numel() for p in model.parameters()) == untied  # the user's model as it was
    # cast, each of the two has a storage of its own: the tie the model declares (its config's) holds them together
    model.to(torch.bfloat16)
    assert parameter_count(model)[""] == tied
    assert memory_footprint(model, (), call, train="adamw").needed() == memory_footprint(cpu.to(torch.bfloat16), (), call, train="adamw").needed()


class _MaskedSoftmaxAttention(torch.nn.Module):
    """Attention whose scores are masked by a value made on the CPU, as SEW-D's (and DeBERTa's,
    before transformers 5) masked softmax does: ``masked_fill(mask, torch.tensor(finfo.min))``."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = (q @ k.transpose(-1, -2)).masked_fill(mask, torch.tensor(torch.finfo(x.dtype).min))
        return scores.softmax(-1) @ v


def test_a_mask_filled_with_a_cpu_value_is_counted_on_meta():
    """The devices' ``masked_fill`` takes a 0-dim value from the CPU; torch's meta kernel refused it
    ("Expected `value` to be on same device as `a`"), so SEW-D failed on meta under both backends.
    jitflops' meta kernel takes it, and checks what torch's does (a value of one dimension is
    refused as on the CPU). Counts by hand: the projection and both products."""
    batch, tokens, hidden = 2, 16, 32
    with torch.device("meta"):
        model = _MaskedSoftmaxAttention(hidden)
    x, mask = torch.randn(batch, tokens, hidden), torch.rand(batch, tokens, tokens) > 0.5
    by_hand = batch * tokens * 3 * hidden * hidden + 2 * batch * tokens * tokens * hidden
    for backend in ("jit", "dispatch"):
        assert FlopCountAnalysis(model, (x.to("meta"), mask.to("meta")), backend=backend).total() == by_hand, backend
    with pytest.raises(RuntimeError, match="0-dimensional value tensor"):
        torch.randn(2, 3).masked_fill(torch.zeros(2, 3, dtype=torch.bool), torch.tensor([0.0]))  # what the CPU says
    from jitflops.frontends.meta_values import DEVICE_META_KERNELS, meta_kernels
    with meta_kernels(DEVICE_META_KERNELS), pytest.raises(RuntimeError, match="0-dimensional value tensor"):
        torch.randn(2, 3, device="meta").masked_fill(torch.zeros(2, 3, dtype=torch.bool, device="meta"), torch.tensor([0.0]))


class _ReadsItsLength(torch.nn.Module):
    """A forward that reads a value, as XLM's and Longformer's do (``lengths.max().item()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.linear(x[:, : int(lengths.max().item())])


def test_a_meta_model_that_reads_a_value_is_sent_to_the_cpu_not_to_the_dispatch_backend():
    """The error on meta suggested the dispatch backend, which runs the same forward and reads the
    same value (XLM, Longformer and the vision-language models that place image tokens by value
    failed there too). It now says the forward reads a value and to count the model built on the
    CPU, which counts it (by hand: the Linear on the 5 positions the lengths keep); so does the
    dispatch backend's error, which was torch's alone ("Tensor.item() cannot be called on meta tensors")."""
    with torch.device("meta"):
        model = _ReadsItsLength()
    x, lengths = torch.randn(2, 12, 8), torch.tensor([3, 5])
    with pytest.raises(Exception, match="reads a value, which no tensor on the meta device has.*count the model built on the CPU") as caught:
        FlopCountAnalysis(model, (x, lengths)).total()
    assert "backend='dispatch'" not in str(caught.value)
    with pytest.raises(Exception, match="item") as caught:
        FlopCountAnalysis(model, (x, lengths), backend="dispatch").total()  # why it is not suggested
    assert "count the model built on the CPU" in caught.value.__notes__[0]  # said there too (it was torch's error alone)
    assert FlopCountAnalysis(_ReadsItsLength(), (x, lengths)).total() == 2 * 5 * 8 * 8


def test_a_decode_step_on_meta_leaves_the_cache_given_as_it_was_and_counts_its_attention():
    """A decode step of a model on the meta device, its KV cache given: the count ran the forward
    on the cache itself once (before tracing), which grew it by a position, so that the count's
    attention spanned one position more than the cache held (and a second count two more). The
    dispatch backend, to which the count falls back there (the cache's tensors would be the trace's
    constants), recorded SDPA's math path on meta: products, not attention, where the CPU's
    recording has its fused kernel. By hand: the projections of one token and its attention over
    the 17 positions, in both layers; the CPU's count of the same step agrees."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).eval()
        with torch.no_grad():
            cache = model(input_ids=torch.zeros(1, 16, dtype=torch.long), use_cache=True).past_key_values
    step = {"input_ids": torch.zeros(1, 1, dtype=torch.long, device="meta"), "past_key_values": cache}
    by_hand = {"linear": 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) + 64 * 1000, "scaled_dot_product_attention": 2 * 4 * 17 * 2 * 16}
    for backend in ("jit", "dispatch", "jit"):
        analysis = FlopCountAnalysis(model, (), step, backend=backend).unsupported_ops_warnings(False)
        assert {"linear" if op == "mm" else op: n for op, n in analysis.by_operator().items()} == by_hand, backend
        assert cache.get_seq_length() == 16
    on_the_cpu = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        cpu_cache = on_the_cpu(input_ids=torch.zeros(1, 16, dtype=torch.long), use_cache=True).past_key_values
    assert FlopCountAnalysis(on_the_cpu, (), {"input_ids": torch.zeros(1, 1, dtype=torch.long), "past_key_values": cpu_cache}).by_operator() == by_hand


def test_timing_a_model_on_meta_is_refused_and_says_what_to_do_instead():
    """``time_model`` and the op table ran a model on the meta device (its ops run there without
    computing) and gave their microseconds as its latency (a small Llama's embedding: 0.07 to
    0.12 ms, the time of nothing). Both now refuse, naming counts and predicted time, which a
    profile of the same model still gives (by hand: the Linear's MACs, twice as FLOPs)."""
    from jitflops import profile_model, time_model

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(64, 64))
    x = torch.randn(8, 64)
    with pytest.raises(ValueError, match="on the meta device nothing runs.*predict its time"):
        time_model(model, x)
    with pytest.raises(ValueError, match="op table of Sequential"):
        profile_model(model, x, with_ops=True)
    profile = profile_model(model, x, device="h100")
    assert profile.root.latency is None and profile.root.flops == 2 * 8 * 64 * 64 and profile.root.predicted_s > 0


def _small_transformers() -> dict[str, tuple[type, object, dict[str, torch.Tensor]]]:
    transformers = pytest.importorskip("transformers")
    ids = torch.randint(0, 100, (2, 8))
    text = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    sizes = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4)
    return {
        "ViT": (transformers.ViTForImageClassification, transformers.ViTConfig(**sizes, image_size=32, patch_size=8),
                {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([0, 1])}),
        "Llama GQA": (transformers.LlamaForCausalLM, transformers.LlamaConfig(**sizes, num_key_value_heads=2, vocab_size=100), text),
        "GPT-2": (transformers.GPT2LMHeadModel, transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100), text),
    }


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("family", ["ViT", "Llama GQA", "GPT-2"])
def test_a_backward_on_meta_counts_what_the_cpus_backward_counts(family, training):
    """A backward counted on meta took attention's math path, which meta tensors take for every call,
    where the CPU runs its flash kernel, whose backward recomputes the scores: the meta count missed
    that recompute (a small ViT: 8,078,976 MACs against the CPU's 8,152,960). Attention on meta now
    runs by the kernel torch would choose on the CPU: its flash kernel, or the math path for
    attention that drops out (GPT-2 training). The reference is the same model's count on the CPU,
    phase by phase; the ViT's recompute, by hand, is the scores once more in each layer."""
    model_class, config, call = _small_transformers()[family]
    torch.manual_seed(0)
    on_the_cpu = model_class(config).train(training)
    with torch.device("meta"):
        on_meta = model_class(config).train(training)
    expected = FlopCountAnalysis(on_the_cpu, (), call, backend="dispatch", backward=True).by_phase()
    assert FlopCountAnalysis(on_meta, (), call, backend="dispatch", backward=True).by_phase() == expected
    if family == "ViT":
        layers, batch, heads, tokens, head_dim = 2, 2, 4, (32 // 8) ** 2 + 1, 16
        assert expected["recompute"] == layers * batch * heads * tokens * tokens * head_dim
    if family == "GPT-2" and training:
        assert "recompute" not in expected  # dropout: the CPU's math path, which saves the scores


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_model_with_gradient_checkpointing_is_counted_and_predicted_on_meta_and_the_cpu(reentrant):
    """transformers' ``gradient_checkpointing_enable()``: the backward runs each layer's forward again,
    in the backward, where torch turns every torch function mode off, so attention there runs
    natively. On meta (and on fake tensors, a training step's prediction) the forward ran attention
    by its fused stand-in instead, and the recomputed tensors were not those saved: the backward's
    count on meta and ``predict_training_step`` on the CPU and on meta raised ``CheckpointError``. A
    checkpointed layer's attention now runs as its recomputation will. The CPU's count is torch's
    ``FlopCounterMode`` of the same step, which has no formula for the CPU's flash kernel, plus that
    kernel by hand (forward, the recomputation's forward, and a backward of 2.5 forwards); on meta the
    phases are the CPU's but the flash backward's recompute of the scores (the math path's backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    from jitflops import predict_training_step

    model_class, config, call = _small_transformers()["Llama GQA"]
    torch.manual_seed(0)
    on_the_cpu = model_class(config).train()
    with torch.device("meta"):
        on_meta = model_class(config).train()
    for model in (on_the_cpu, on_meta):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    counted = FlopCountAnalysis(on_the_cpu, (), call, backend="dispatch", backward=True).by_phase()
    with FlopCounterMode(display=False) as torch_count:
        on_the_cpu(**call).loss.backward()
    layers, batch, heads, tokens, head_dim = 2, 2, 4, 8, 16
    scores = layers * batch * heads * tokens * tokens * head_dim  # q @ k^T in each layer; weights @ v as many
    assert 2 * sum(counted.values()) == torch_count.get_total_flops() + 2 * (2 * scores) * 4.5
    assert FlopCountAnalysis(on_meta, (), call, backend="dispatch", backward=True).by_phase() == {**counted, "recompute": counted["recompute"] - scores}
    assert predict_training_step(on_meta, (), call, device="h100") == predict_training_step(on_the_cpu, (), call, device="h100")


def test_a_model_loaded_with_a_layer_offloaded_to_disk_is_counted_as_the_model_loaded_whole(tmp_path):
    """``from_pretrained(..., device_map=...)`` with a layer on ``"disk"``: accelerate leaves that
    layer's weights on meta and hooks every module's ``forward`` to bring its weights and inputs to
    the execution device. Every front end failed on it ("Cannot copy out of meta tensor"; "Please
    convert all Tensors to FakeTensors first" in the memory estimate): the meta copy ran the hooks,
    which call the user's modules. The copy now runs each module's own ``forward``: the counts, the
    memory, the predictions and generation's steps are the model's loaded whole, and the model
    still generates."""
    from jitflops import count_generation, get_model_profile, memory_footprint, predict_training_step

    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
    torch.manual_seed(0)
    whole = transformers.LlamaForCausalLM(config).eval()
    whole.save_pretrained(tmp_path / "model")
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    offloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "model", device_map=device_map, offload_folder=tmp_path / "offload").eval()
    assert offloaded.model.layers[1].self_attn.q_proj.weight.is_meta and hasattr(offloaded, "_hf_hook")
    ids = torch.randint(0, 100, (2, 8))
    call, step = {"input_ids": ids}, {"input_ids": ids, "labels": ids}
    for backend in ("jit", "dispatch"):
        assert FlopCountAnalysis(offloaded, (), call, backend=backend).total() == FlopCountAnalysis(whole, (), call, backend=backend).total()
    assert FlopCountAnalysis(offloaded, (), step, backend="dispatch", backward=True).by_phase() == FlopCountAnalysis(whole, (), step, backend="dispatch", backward=True).by_phase()
    assert get_model_profile(offloaded, kwargs=call, print_profile=False, as_string=False) == get_model_profile(whole, kwargs=call, print_profile=False, as_string=False)
    assert memory_footprint(offloaded, (), step, train="adamw").peak == memory_footprint(whole, (), step, train="adamw").peak
    assert predict_training_step(offloaded, (), step, device="h100") == predict_training_step(whole, (), step, device="h100")
    generated = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0}
    assert count_generation(offloaded, ids, **generated).steps == count_generation(whole, ids, **generated).steps
    assert torch.allclose(offloaded(**call).logits, whole(**call).logits, atol=1e-5)  # its hooks still bring the weights in


@pytest.mark.parametrize("family", ["XLNet", "wav2vec2"])
def test_a_model_transformers_leaves_partly_on_the_cpu_is_counted_on_meta(family):
    """Built under ``torch.device("meta")``, 29 of 631 transformers architectures keep a parameter
    or buffer on the CPU (the legacy ``torch.Tensor(n)`` ignores the default device): XLNet's
    attention weights, wav2vec2's ``masked_spec_embed``. Every front end failed on them ("Tensor on
    device meta is not on the expected device cpu!"), with inputs on the CPU or on meta: 1 of the 23
    that run counted before, 15 now (the other 8 read a value). A copy with every tensor on meta is
    counted (wav2vec2's too, whose weight-normed convolution's class refuses ``copy.copy``); the
    counts equal the CPU's, and the model is left as it was."""
    transformers = pytest.importorskip("transformers")
    if family == "XLNet":
        model_class = transformers.XLNetModel
        config = transformers.XLNetConfig(d_model=64, n_layer=2, n_head=4, d_inner=128, vocab_size=100)
        call = {"input_ids": torch.randint(0, 100, (2, 8))}
    else:
        model_class = transformers.Wav2Vec2Model
        config = transformers.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(32, 32),
                                             conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
        call = {"input_values": torch.randn(1, 4000)}
    torch.manual_seed(0)
    on_the_cpu = model_class(config).eval()
    with torch.device("meta"):
        on_meta = model_class(config).eval()
    strays = {name: p for name, p in on_meta.named_parameters() if not p.is_meta}
    assert strays and all(p.is_meta for name, p in on_meta.named_parameters() if name not in strays)
    on_meta_inputs = {name: value.to("meta") for name, value in call.items()}
    for backend, backward in (("jit", False), ("dispatch", False), ("dispatch", True)):
        expected = FlopCountAnalysis(on_the_cpu, (), call, backend=backend, backward=backward).by_phase()
        for given in (call, on_meta_inputs):
            assert FlopCountAnalysis(on_meta, (), given, backend=backend, backward=backward).by_phase() == expected, (backend, backward)
    assert {name: p for name, p in on_meta.named_parameters() if not p.is_meta} == strays  # the same CPU tensors, where they were
