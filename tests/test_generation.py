"""``generate()`` counted step by step: the prefill and each decode step, against hand counts for a
tiny GPT-2 and a Llama with grouped-query attention, and on meta against each family's
``generate`` run on the CPU (``tools/decode_accuracy.py``'s decoders among them)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

from jitflops import count_generation

from helpers import assert_same_state, model_state

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from decode_accuracy import FAMILIES, build  # noqa: E402

PROMPT, NEW = 6, 3


def _generate(model):
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (1, PROMPT))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return count_generation(model.eval(), input_ids=ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0)


def _attention(layers: int, query_heads: int, head_dim: int, queries: int, positions: int) -> int:
    return layers * query_heads * queries * positions * 2 * head_dim  # q @ k^T and weights @ v


def test_gpt2_prefill_and_decode_steps():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    count = _generate(transformers.GPT2LMHeadModel(config))
    per_token = 2 * (32 * 96 + 32 * 32 + 32 * 128 + 128 * 32)  # c_attn, c_proj, the MLP, in both layers
    norms = 5 * 32 * 5  # fvcore's 5 per element; 2 layer norms per layer and the final one
    logits = 32 * 100  # generate asks for the last position's logits only
    assert [(step.tokens, step.positions) for step in count.steps] == [(6, 6), (1, 7), (1, 8)]
    assert count.prefill.macs == PROMPT * (per_token + norms) + _attention(2, 2, 16, 6, 6) + logits
    for step in count.decode:
        assert step.macs == per_token + norms + _attention(2, 2, 16, 1, step.positions) + logits
        assert step.attention_macs == _attention(2, 2, 16, 1, step.positions)
    assert count.generated_tokens == NEW and count.macs_per_generated_token == count.macs / NEW
    assert count.kv_cache_share == pytest.approx(sum(_attention(2, 2, 16, 1, p) for p in (7, 8)) / count.decode_macs)


def test_llama_with_grouped_query_attention():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100)
    count = _generate(transformers.LlamaForCausalLM(config))
    # q and o: 64 x 64; k and v: 64 x 32 (2 of the 4 heads' width); the gated MLP: 3 x 64 x 128
    per_token = 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128)
    logits = 64 * 100
    # Llama's RMS norms and rotary embeddings are elementwise (0 by default); each of the 4 query
    # heads attends over every position, whichever key head it shares
    assert count.prefill.macs == PROMPT * per_token + _attention(2, 4, 16, 6, 6) + logits
    assert [step.macs for step in count.decode] == [per_token + _attention(2, 4, 16, 1, p) + logits for p in (7, 8)]
    assert count.decode_macs_per_token == (count.decode[0].macs + count.decode[1].macs) / 2


def test_a_compiled_models_generate_is_counted_and_predicted_as_the_module_it_wraps_runs_it():
    """``torch.compile(model).generate`` is the wrapped module's ``generate`` (the wrapper hands it
    over), and it calls that module, uncompiled. Its count had no step at all (the calls went past
    the wrapper), on meta the prefill's whole logits, and ``predict_generation`` lost generate's own
    work. Now each is the wrapped module's: the hand count of the Llama test, its prediction."""
    from jitflops import predict_generation

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100)
    model = transformers.LlamaForCausalLM(config).eval()
    per_token, logits = 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128), 64 * 100
    count = _generate(torch.compile(model))
    assert [step.macs for step in count.steps] == [PROMPT * per_token + _attention(2, 4, 16, 6, 6) + logits,
                                                    *(per_token + _attention(2, 4, 16, 1, p) + logits for p in (7, 8))]
    with torch.device("meta"):
        on_meta = transformers.LlamaForCausalLM(config)
    assert _generate(torch.compile(on_meta)).steps == count.steps
    ids = torch.randint(0, 100, (1, PROMPT))
    assert predict_generation(torch.compile(model), ids, NEW, device="h100") == predict_generation(model, ids, NEW, device="h100")


def test_get_model_profile_in_generate_mode_shows_prefill_and_decode_steps(capsys):
    from jitflops import get_model_profile

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)).eval()
    ids = torch.randint(0, 100, (1, PROMPT))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flops, macs, _ = get_model_profile(model, kwargs=dict(input_ids=ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0),
                                           mode="generate", warm_up=0, as_string=False)
    out = capsys.readouterr().out
    count = _generate(model)
    assert macs == count.macs  # every forward of the generation, as the steps add up
    assert "prefill MACs (6 tokens):" in out and "decode step 2 MACs (1 token over 8 positions):" in out
    assert "KV cache share of the decode MACs" in out


@pytest.mark.parametrize("family", ["gpt2", "llama", "mixtral", "mbart", "prophetnet", "bert", "cpmant", "openai-gpt"])
def test_a_model_on_meta_is_counted_step_by_step_without_running_generate(family):
    """A model on the meta device has no values to generate with: ``generate`` failed inside its
    first forward ("Tensor on device meta is not on the expected device cpu!"). Its calls are made
    as ``generate`` makes them (the prefill, then each decode step over the cache the steps before
    leave): every step equals the count of the same model on the CPU, whose ``generate`` ran, and
    whose figures the tests above check by hand. The prompt given on the CPU, as users make it.
    A float32 mixture of experts (Mixtral's grouped product, whose meta kernel in torch takes
    bfloat16 alone) failed in the forward that makes a decode step's cache: the count on meta and
    ``predict_generation`` of any such model (8 of 29 decoders in a sweep of every sixth); MBart's
    and Blenderbot's decoders there, which read the mask they make ("Tensor.item() cannot be called
    on meta tensors"); ProphetNet's n-gram attention, which checks its position ids at each decode
    step with ``torch_compilable_check`` (the same words, until 2026-12-07: its count and prediction
    on meta, and its prediction on the CPU); BERT as a causal language model without ``is_decoder``,
    which makes no cache but fills the one ``generate`` passes it ("returned no cache" until
    2026-12-07, and BigBird's, RoBERTa's, MegatronBERT's so); CPM-Ant, whose decode steps take every
    id, its forward dropping those its cache holds (over the last id alone it attended over none, and
    failed); OpenAI GPT, which keeps no cache, its every step over all the ids (refused until
    2026-12-07). Its prediction on meta is the CPU model's."""
    from jitflops import predict_generation

    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
        model_class = transformers.GPT2LMHeadModel
    elif family == "mbart":
        config = transformers.MBartConfig(d_model=64, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=128, vocab_size=100, eos_token_id=None,
                                          forced_eos_token_id=None)
        model_class = transformers.MBartForCausalLM
    elif family == "prophetnet":
        config = transformers.ProphetNetConfig(hidden_size=64, decoder_ffn_dim=128, num_decoder_layers=2, num_decoder_attention_heads=4, vocab_size=100,
                                               ngram=2, eos_token_id=None)
        model_class = transformers.ProphetNetForCausalLM
    elif family == "bert":
        config = transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=100)
        model_class = transformers.BertLMHeadModel
    elif family == "cpmant":
        config = transformers.CpmAntConfig(hidden_size=64, dim_ff=128, num_hidden_layers=2, num_attention_heads=4, dim_head=16, vocab_size=100, prompt_length=4)
        model_class = transformers.CpmAntForCausalLM
    elif family == "openai-gpt":
        config = transformers.OpenAIGPTConfig(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=64)
        model_class = transformers.OpenAIGPTLMHeadModel
    elif family == "mixtral":
        config = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            vocab_size=100, num_local_experts=4, num_experts_per_tok=2, eos_token_id=None)  # every token generated
        model_class = transformers.MixtralForCausalLM
    else:
        config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
        model_class = transformers.LlamaForCausalLM
    with torch.device("meta"):
        meta = model_class(config).eval()
    ids = torch.randint(0, 100, (1, PROMPT))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on_meta = count_generation(meta, input_ids=ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
        by_length = count_generation(meta, ids, max_length=PROMPT + NEW)
    assert on_meta.steps == by_length.steps == _generate(model_class(config)).steps
    if family == "cpmant":  # generate passes every id, its forward dropping those its cache holds: one token's work
        assert on_meta.steps[1].macs < on_meta.steps[0].macs / 2
    elif family == "openai-gpt":  # no cache: every id again at each step
        assert [(step.tokens, step.positions) for step in on_meta.steps] == [(6, 6), (7, 7), (8, 8)]
    else:
        assert [(step.tokens, step.positions) for step in on_meta.steps] == [(6, 6), (1, 7), (1, 8)]
    # attention counted as attention (SDPA), not as products; ProphetNet's n-gram attention, CPM-Ant's and OpenAI GPT's are products alone
    assert all(step.attention_macs > 0 for step in on_meta.steps) is (family not in ("prophetnet", "cpmant", "openai-gpt"))
    assert predict_generation(meta, ids, NEW, device="h100") == predict_generation(model_class(config).eval(), ids, NEW, device="h100")
    with pytest.raises(ValueError, match="num_beams"):
        count_generation(meta, input_ids=ids, max_new_tokens=NEW, num_beams=2)


def test_deepspeeds_generate_mode_on_a_meta_model_says_what_counts_it():
    """``get_model_profile(mode="generate")`` times ``generate()``, which a model on meta cannot run:
    it failed with "Cannot copy out of meta tensor; no data!". It now names count_generation, which
    counts the steps (here the prefill's 6 tokens and 2 decode steps)."""
    from jitflops import get_model_profile

    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)).eval()
    ids = torch.randint(0, 100, (1, PROMPT))
    with pytest.raises(ValueError, match="meta device.*count_generation"):
        get_model_profile(model, kwargs=dict(input_ids=ids, max_new_tokens=NEW), mode="generate", print_profile=False, warm_up=0)
    assert [(step.tokens, step.positions) for step in count_generation(model, input_ids=ids, max_new_tokens=NEW).steps] == [(6, 6), (1, 7), (1, 8)]


def test_a_decoder_whose_forward_reads_a_value_is_predicted_on_its_values():
    """JetMoE's router reads its experts' loads (a value a meta tensor lacks): ``predict_generation``
    of the model built on the CPU failed in its meta copy until 2026-12-07 ("Cannot copy out of meta
    tensor"). It runs on a copy with the model's values then: its prefill is predicted as the same
    call on the model itself is, the model left as it was; on meta it still fails, naming the router."""
    from jitflops import PredictedTimeAnalysis, TraceError, predict_generation
    from jitflops.estimates.generation_time import generate_call

    config = transformers.JetMoeConfig(hidden_size=64, num_hidden_layers=2, num_key_value_heads=2, kv_channels=16, intermediate_size=128,
                                       num_local_experts=4, num_experts_per_tok=2, vocab_size=100)
    torch.manual_seed(0)
    model = transformers.JetMoeForCausalLM(config).eval()
    before = model_state(model)
    ids = torch.randint(0, 100, (1, PROMPT))
    predicted = predict_generation(model, ids, NEW, device="h100")
    prefill = PredictedTimeAnalysis(model, (), generate_call(model, ids, 0, None), device="h100", backend="dispatch")
    assert predicted.prefill_s == pytest.approx(prefill.unsupported_ops_warnings(False).uncalled_modules_warnings(False).total(), rel=1e-9)
    assert predicted.decode_steps == NEW - 1 and predicted.first_decode_s > 0
    assert_same_state(before, model_state(model))
    with torch.device("meta"):
        meta = transformers.JetMoeForCausalLM(config).eval()
    with pytest.raises(TraceError, match=r"experts.router' \(JetMoeTopKGating\)"):
        predict_generation(meta, ids, NEW, device="h100")



@pytest.mark.parametrize("family", [family for family in FAMILIES if family not in ("llama", "gpt2")])
def test_the_decode_accuracy_tools_families_are_counted_and_predicted_on_meta_as_generate_runs_them(family):
    """``tools/decode_accuracy.py``'s tiny decoders of twelve more families (its Llama and GPT-2 are
    above): on meta, each step of ``generate`` counted as the model's ``generate`` on the CPU runs
    it (the prefill, then one token over the cache a step), and its prediction the CPU model's."""
    from jitflops import predict_generation

    with torch.device("meta"):
        meta = build(family)
    ids = torch.randint(0, 100, (1, PROMPT))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on_meta = count_generation(meta, input_ids=ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    assert on_meta.steps == _generate(build(family)).steps
    assert [(step.tokens, step.positions) for step in on_meta.steps] == [(6, 6), (1, 7), (1, 8)]
    assert predict_generation(meta, ids, NEW, device="h100") == predict_generation(build(family), ids, NEW, device="h100")
