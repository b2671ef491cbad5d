"""The memory estimate against hand counts, torch's own ``MemTracker`` and the profiler's memory
timeline on real steps, and its errors. ``tools/memory_accuracy.py`` runs 11 transformers models
in inference, AdamW and checkpointing, and FSDP2 on 2 gloo ranks."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import nn

from jitflops import largest_fitting, memory_footprint, memory_summary, memory_table
from jitflops.deepspeed.flops_profiler import FlopsProfiler
from jitflops.reports.formatting import deepspeed_bytes, deepspeed_params
from jitflops.cli import main
from jitflops.estimates.devices import DeviceSpecError
from jitflops.core.errors import TraceError
from jitflops.estimates.fake_sharding import ShardingError, shard_like_tensor_parallel
from jitflops.estimates.optimizers import UnknownOptimizerError

from helpers import run_on_ranks
from sharded_cases import memtracker_peak
from test_distributed import process_group_file

transformers = pytest.importorskip("transformers")

FP32 = 4


def _mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)), torch.randn(64, 256)


def _llama(layers: int = 2) -> nn.Module:
    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=1000, max_position_embeddings=512)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def _adamw_step(model: nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[Callable[[], None], torch.optim.Optimizer]:
    """An AdamW step of ``model`` from its loss on ``inputs`` (the output dropped before the
    optimizer steps), run once so that the next is steady, and its optimizer."""
    optimizer = torch.optim.AdamW(model.parameters())

    def step() -> None:
        output = model(**inputs)
        output.loss.backward()
        del output
        optimizer.step()
        optimizer.zero_grad()
    step()
    return step, optimizer


def _steady_adamw_peak(model: nn.Module, inputs: dict[str, torch.Tensor]) -> int:
    """MemTracker's peak of a steady AdamW step of ``model`` (:func:`_adamw_step`)."""
    step, optimizer = _adamw_step(model, inputs)
    return memtracker_peak(step, model, optimizer)


def test_mlp_with_adamw_by_hand_and_by_memtracker():
    model, x = _mlp()
    estimate = memory_footprint(model, x, train="adamw")
    parameters = (256 * 1024 + 1024 + 1024 * 256 + 256) * FP32
    assert estimate.model.parameters == parameters == 2_102_272
    assert estimate.model.gradients == parameters
    assert estimate.model.optimizer_state == 2 * parameters + 4 * FP32  # exp_avg, exp_avg_sq; a float32 step per tensor
    # ReLU saves its output (Linear 2 saves the same storage as its input: counted once); Linear 1
    # saves the model's input (an input, not an activation) and the weights (parameters)
    assert estimate.modules["1"].saved_activations == 64 * 1024 * FP32
    assert estimate.modules["0"].saved_activations == estimate.modules["2"].saved_activations == 0
    assert estimate.model.saved_activations == 64 * 1024 * FP32
    assert estimate.peak_phase == "optimizer"

    optimizer = torch.optim.AdamW(model.parameters())

    def step() -> None:
        output = model(x)
        output.sum().backward()
        del output
        optimizer.step()
        optimizer.zero_grad()
    step()
    # MemTracker does not see the input, made before it started
    assert estimate.peak == memtracker_peak(step, model, optimizer) + x.nbytes
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inference = memory_footprint(model, x)
    assert inference.mode == "inference" and inference.model.gradients == 0 and inference.model.saved_activations == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("mode", ["inference", "adamw"])
def test_llama_against_memtracker_and_the_profilers_timeline(mode):
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    model = _llama()
    ids = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "labels": ids}
    estimate = memory_footprint(model, inputs, train=None if mode == "inference" else "adamw")
    optimizer = None
    if mode == "inference":
        model.eval()

        def step() -> None:
            with torch.no_grad():
                model(**inputs)
    else:
        step, optimizer = _adamw_step(model, inputs)
    tracked = memtracker_peak(step, model, optimizer) + 2 * ids.nbytes
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    timeline = max(sum(row) for row in sizes)
    assert abs(estimate.peak / tracked - 1) < 0.001
    assert abs(estimate.peak / timeline - 1) < 0.001


def test_a_model_prepared_by_accelerate_for_mixed_precision_against_memtracker():
    """``Accelerator(mixed_precision="bf16").prepare(model)`` sets ``model.forward`` to a method bound
    to the model that runs its forward under autocast: the estimates' copy called the user's model
    through it and failed ("Please convert all Tensors to FakeTensors first"). The copy's is bound to
    the copy: the inference peak is MemTracker's, with autocast's bfloat16 copies of the weights
    (3,911,296 bytes, 14% more than the model's without autocast), and the training step's within 0.01%."""
    accelerate = pytest.importorskip("accelerate")
    from jitflops import predict_training_step

    model = accelerate.Accelerator(mixed_precision="bf16", cpu=True).prepare(_llama())
    ids = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(0))
    inference = memory_footprint(model, {"input_ids": ids})

    def infer() -> None:
        with torch.no_grad():
            model(input_ids=ids)
    assert inference.peak == memtracker_peak(infer, model) + ids.nbytes
    assert inference.peak > memory_footprint(_llama(), {"input_ids": ids}).peak * 1.1
    inputs = {"input_ids": ids, "labels": ids.clone()}
    training = memory_footprint(model, inputs, train="adamw")
    assert abs(training.peak / (_steady_adamw_peak(model, inputs) + 2 * ids.nbytes) - 1) < 0.0001
    assert predict_training_step(model, (), inputs, device="h100").backward_s > 0


def test_a_model_under_weight_norm_parametrization_against_memtracker():
    """``torch.nn.utils.parametrizations.weight_norm`` (wav2vec2's, HuBERT's and WavLM's position
    convolution) makes a class whose ``__getstate__`` refuses copies: every estimate on a copy
    failed ("Serialization of parametrized modules is only supported through state_dict()"). The
    copy is made from the module's state as any module's: an MLP's AdamW step and wav2vec2's
    inference against MemTracker (which sees wav2vec2's input, viewed by its first op)."""
    from jitflops import predict_training_step

    torch.manual_seed(0)
    mlp, x = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), torch.randn(4, 16)
    nn.utils.parametrizations.weight_norm(mlp[0])
    training = memory_footprint(mlp, (x,), train="adamw")
    optimizer = torch.optim.AdamW(mlp.parameters())

    def step() -> None:
        mlp(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    step()
    assert training.peak == memtracker_peak(step, mlp, optimizer) + x.nbytes
    assert predict_training_step(mlp, (x,), device="h100").backward_s > 0
    config = transformers.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(32, 32), conv_stride=(5, 4),
                                         conv_kernel=(10, 8), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, vocab_size=12)
    wav2vec2, audio = transformers.Wav2Vec2ForCTC(config).eval(), torch.randn(2, 4000)

    def infer() -> None:
        with torch.no_grad():
            wav2vec2(audio)
    assert memory_footprint(wav2vec2, (audio,)).peak == memtracker_peak(infer, wav2vec2)


def test_a_forward_that_reads_a_value_is_estimated_on_the_models_values_and_on_meta_says_what_to_leave_out():
    """wav2vec2's CTC loss reads its labels' lengths (``.item()``), and Qwen2-VL's vision tower its
    patch grid, which fake tensors do not have: the memory estimate and the training step's
    prediction failed (one transformers architecture in five, in a sweep of every eighth). A model
    with values now runs its step on a copy with them, under the same accounting: MemTracker's peak
    to the byte (beside the inputs MemTracker does not see: CTC's labels), the model untouched. On
    meta, where there are no values, the error names the root module and says to leave out the input
    whose values the forward reads."""
    from jitflops import TraceError, predict_training_step
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel, Qwen2VLVisionConfig

    config = transformers.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(32, 32), conv_stride=(5, 4),
                                         conv_kernel=(10, 8), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, vocab_size=12, layerdrop=0.0)
    torch.manual_seed(0)
    model, audio = transformers.Wav2Vec2ForCTC(config), torch.randn(2, 4000)
    call = {"input_values": audio, "labels": torch.randint(1, 12, (2, 10))}
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    estimate = memory_footprint(model, (), call, train="adamw")
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    assert estimate.settings["computed"] == "on the model's values, which its forward reads"
    assert predict_training_step(model, (), call, device="h100").backward_s > 0
    assert estimate.peak == _steady_adamw_peak(model, call) + call["labels"].nbytes

    vision = Qwen2VisionTransformerPretrainedModel(Qwen2VLVisionConfig(depth=2, embed_dim=64, hidden_size=64, num_heads=4, mlp_ratio=2)).eval()
    patches = {"hidden_states": torch.randn(96, 3 * 2 * 14 * 14), "grid_thw": torch.tensor([[1, 8, 12]])}  # 8 x 12 patches of 14 pixels, 2 frames

    def infer() -> None:
        with torch.no_grad():
            vision(**patches)
    assert memory_footprint(vision, (), patches).peak == memtracker_peak(infer, vision)  # whose ops read both inputs

    with torch.device("meta"):
        on_meta = transformers.Wav2Vec2ForCTC(config)
    meta_call = {name: tensor.to("meta") for name, tensor in call.items()}
    for unrun in (lambda: memory_footprint(on_meta, (), meta_call, train="adamw"), lambda: predict_training_step(on_meta, (), meta_call, device="h100"),
                  lambda: memory_footprint(model, (), call, train="adamw", compute=False)):
        with pytest.raises(TraceError, match=r"the root module \(Wav2Vec2ForCTC\)") as raised:
            unrun()
        assert "leave out the input whose values it reads" in " ".join(raised.value.__notes__)


@functools.lru_cache(maxsize=None)
def _sine_table(width: int, device: torch.device) -> torch.Tensor:
    return torch.sin(torch.arange(width, device=device, dtype=torch.float32))


class _CachedTable(nn.Module):
    """A layer adding a table cached by size and device, as transformers' D-FINE, RT-DETR and
    PP-DocLayout cache their sine position embeddings (``lru_cache`` on a static method)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + _sine_table(16, x.device)


def test_a_table_a_library_cached_on_a_real_run_is_read_by_the_estimate():
    """After one real forward, a table cached process-wide by size and device is a real tensor, which
    the estimate's fake copy (on the same device) is handed: the estimate failed ("Please convert all
    Tensors to FakeTensors first"; D-FINE, PP-DocLayout v4 and Mask2Former in a transformers sweep
    after their real forward). It takes it as a constant now: MemTracker's peak, and the training step
    is predicted."""
    from jitflops import predict_training_step

    torch.manual_seed(0)
    model, x = _CachedTable(), torch.randn(4, 16)
    model(x)  # the table is cached, real
    estimate = memory_footprint(model, (x,))

    def infer() -> None:
        with torch.no_grad():
            model(x)
    assert estimate.peak == memtracker_peak(infer, model) + x.nbytes
    assert predict_training_step(model, (x,), device="h100").backward_s > 0


MIXTURES_OF_EXPERTS = {
    "mixtral": dict(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=800,
                    num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=800,
                      head_dim=24, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64),
    "deepseek_v3": dict(hidden_size=96, intermediate_size=160, moe_intermediate_size=64, num_hidden_layers=2, first_k_dense_replace=1,
                        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1,
                        topk_group=1, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, vocab_size=800),
}
"""Small configurations of the mixture-of-experts families: transformers runs their experts as one
grouped product (``torch._grouped_mm``) in float32 too, whose meta kernel in torch takes bfloat16 alone."""


def _mixture_of_experts(family: str, dtype: torch.dtype, device: str = "cpu") -> nn.Module:
    config = transformers.AutoConfig.for_model(family, **MIXTURES_OF_EXPERTS[family])
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(config).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("family", MIXTURES_OF_EXPERTS)
def test_a_mixture_of_experts_in_either_dtype_against_memtracker(family, dtype):
    """The grouped product of experts in float32, as ``from_config`` makes the model: the estimate
    raised inside torch's meta kernel (bfloat16 only) where the real step runs on the CPU."""
    model = _mixture_of_experts(family, dtype)
    ids = torch.randint(0, 800, (2, 64), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "labels": ids.clone()}  # MemTracker does not see the inputs, made before it started
    inference, training = memory_footprint(model, inputs), memory_footprint(model, inputs, train="adamw")
    model.eval()

    def infer() -> None:
        with torch.no_grad():
            model(**inputs)
    assert inference.peak == memtracker_peak(infer, model) + 2 * ids.nbytes
    model.train()
    assert training.peak == _steady_adamw_peak(model, inputs) + 2 * ids.nbytes


def test_a_mixture_of_experts_on_the_meta_device_for_a_gpu():
    """A float32 model built on meta, estimated for an H100: the same step as the CPU model's, its
    allocations rounded as the CUDA caching allocator rounds them."""
    ids = torch.zeros(2, 64, dtype=torch.long)
    on_cpu = memory_footprint(_mixture_of_experts("deepseek_v3", torch.float32), {"input_ids": ids, "labels": ids}, train="adamw", device="h100")
    meta_ids = ids.to("meta")
    on_meta = memory_footprint(_mixture_of_experts("deepseek_v3", torch.float32, "meta"), {"input_ids": meta_ids, "labels": meta_ids}, train="adamw", device="h100")
    assert on_meta.peak == on_cpu.peak and on_meta.rounding == 512


def test_a_tied_weights_gradient_and_state_are_counted_where_the_weight_is():
    config = transformers.GPT2Config(n_embd=64, n_layer=1, n_head=4, vocab_size=1000, n_positions=64)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.zeros(2, 16, dtype=torch.long)
    estimate = memory_footprint(model, {"input_ids": ids, "labels": ids}, train="adamw")
    embedding = estimate.modules["transformer.wte"]
    table = 1000 * 64 * FP32
    assert (embedding.parameters, embedding.gradients, embedding.optimizer_state) == (table, table, 2 * table + FP32)
    head = estimate.modules["lm_head"]
    assert (head.parameters, head.gradients, head.optimizer_state) == (0, 0, 0)
    assert head.saved_activations == 2 * 16 * 64 * FP32  # the final hidden states it multiplies


def test_the_kv_cache_of_a_llama_by_hand():
    model = _llama(layers=3)
    ids = torch.zeros(2, 16, dtype=torch.long)
    estimate = memory_footprint(model, ids, kv_cache_length=4096)
    per_token = 3 * 2 * 2 * 32 * FP32  # layers x (keys, values) x KV heads x head size x float32
    assert estimate.kv_cache.bytes_per_token == per_token
    assert estimate.kv_cache.bytes == per_token * 2 * 4096
    assert estimate.needed() == estimate.peak + per_token * 2 * (4096 - 16)
    assert "KV cache" in memory_summary(estimate)


def test_an_output_without_a_cache_is_not_asked_for_one_by_its_old_name():
    """transformers 5.25 logs "`past_key_values`/`cache_params` are deprecated" when an output is
    asked for ``past_key_values`` by name. The estimate asked every output that had no ``cache``,
    so a ViT's user saw that log about a cache neither had. The ViT's peak is checked against
    MemTracker as the other estimates are."""
    import logging

    from torch.distributed._tools.mem_tracker import MemTracker

    transformers = pytest.importorskip("transformers")
    from transformers.utils import logging as transformers_logging

    model = transformers.ViTModel(transformers.ViTConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2)).eval()
    pixels = torch.randn(1, 3, 224, 224)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    transformers_logging.get_logger().addHandler(handler)
    transformers_logging.warning_once.cache_clear()  # once a process: this test must see it
    try:
        estimate = memory_footprint(model, pixels)
    finally:
        transformers_logging.get_logger().removeHandler(handler)
    assert [record.getMessage() for record in records] == []
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker, torch.no_grad():
        model(pixels)
    measured = next(peak["Total"] for where, peak in tracker.get_tracker_snapshot("peak").items() if where.type == "cpu")
    assert estimate.peak == measured + pixels.untyped_storage().nbytes()


def test_checkpointing_keeps_less_than_saving_everything():
    model = _llama()
    ids = torch.randint(0, 1000, (2, 128))
    full = memory_footprint(model, {"input_ids": ids, "labels": ids}, train="adamw")
    checkpointed = memory_footprint(model, {"input_ids": ids, "labels": ids}, train="adamw", checkpointing=True)
    # the decoder layers keep only their inputs (the checkpoint's), recomputed in the backward
    assert checkpointed.modules["model.layers"].saved_activations < full.modules["model.layers"].saved_activations / 4
    assert checkpointed.peak < full.peak
    assert not getattr(model.model, "gradient_checkpointing", False)  # the user's model is not changed


def test_mixed_precision_master_weights_and_8bit_adam_layouts():
    layer = nn.Linear(512, 512)
    x = torch.randn(8, 512)
    weights = 512 * 512 + 512
    bf16 = memory_footprint(layer, x, train="adamw", dtype=torch.bfloat16, master_weights=True)
    assert bf16.model.parameters == 2 * weights
    # float32 master copies and two float32 moments; a step per tensor
    assert bf16.model.optimizer_state == 3 * FP32 * weights + 2 * FP32
    eight_bit = memory_footprint(layer, x, train="adam8bit")
    # the weight in 8 bits with an absmax per 256 elements; the bias (< 4096 elements) in float32
    assert eight_bit.model.optimizer_state == 2 * (512 * 512 + math.ceil(512 * 512 / 256) * FP32) + 2 * 512 * FP32 + 2 * FP32
    sgd = memory_footprint(layer, x, train="sgd")
    momentum = memory_footprint(layer, x, train="sgd-momentum")
    assert sgd.model.optimizer_state == 0 and momentum.model.optimizer_state == FP32 * weights
    autocast = memory_footprint(layer, x, train="adamw", autocast=torch.bfloat16)
    assert autocast.model.saved_activations < memory_footprint(layer, x, train="adamw").model.saved_activations + 2 * weights


def test_fsdp2_shards_per_rank():
    model = _llama()
    ids = torch.randint(0, 1000, (2, 64))
    whole = memory_footprint(model, {"input_ids": ids, "labels": ids}, train="adamw")
    sharded = memory_footprint(model, {"input_ids": ids, "labels": ids}, train="adamw", fsdp=2)
    assert sharded.model.parameters * 2 == whole.model.parameters
    assert sharded.model.optimizer_state * 2 == pytest.approx(whole.model.optimizer_state, rel=0.01)
    assert sharded.peak < whole.peak
    assert not torch.distributed.is_initialized()


def test_fits_and_the_largest_batch():
    model, x = _mlp()
    estimate = memory_footprint(model, x, train="adamw")
    assert estimate.fits("h100") and estimate.fits(estimate.peak) and not estimate.fits(estimate.peak - 1)
    budget = 16 * 2**20
    largest, at_largest = largest_fitting(model, lambda n: torch.randn(n, 256), budget, train="adamw")
    assert at_largest.fits(budget)
    assert not memory_footprint(model, torch.randn(largest + 1, 256), train="adamw").fits(budget)
    assert largest_fitting(model, lambda n: torch.randn(n, 256), 1000, train="adamw") == (0, None)


def test_when_nothing_fits_the_cli_shows_the_smallest_estimate_and_what_would_fit(tmp_path, capsys):
    """Each lever's peak is memory_footprint's with its options, and the fewest FSDP2 ranks it names
    fit where half as many do not."""
    import dataclasses

    from jitflops.estimates.devices import device_spec

    settings = dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=4000)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**settings)).eval()
    ids = torch.zeros(1, 64, dtype=torch.long)
    at_one = memory_footprint(model, ids, train="adamw", device="h100")
    small = dataclasses.replace(device_spec("h100"), name="small-gpu", memory_bytes=int(at_one.peak * 0.45))
    spec = tmp_path / "small.json"
    spec.write_text(small.to_json())
    command = ["transformers:LlamaForCausalLM", "--config", *(f"{key}={value}" for key, value in settings.items()), "--input-ids", "1,64",
               "--train", "adamw", "--device", str(spec), "--fit", "batch", "--quiet"]
    assert main(command) == 2
    out, err = capsys.readouterr()
    assert "even a batch of 1 does not fit on small-gpu" in err
    assert "Even a batch of 1 does not fit on small-gpu. At a batch of 1:" in out and f"({at_one.peak:,} B)" in out
    assert f"{memory_summary(at_one, small).splitlines()[-1].strip()}" in out and "over" in out
    levers = out.split("What would fit")[1].split("\n\n")[0].splitlines()[3:]
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in levers}
    for lever, options in {"8-bit Adam": dict(train="adam8bit"), "activation checkpointing": dict(train="adamw", checkpointing=True),
                           "bfloat16 weights, float32 master weights": dict(train="adamw", dtype=torch.bfloat16, master_weights=True)}.items():
        assert rows[lever] == memory_summary(memory_footprint(model, ids, device=small, **options)).split("peak: ")[1].split(" (")[0]
    fsdp = next(name for name in rows if name.startswith("FSDP2 over"))
    ranks = int(fsdp.split()[2])
    assert memory_footprint(model, ids, train="adamw", device=small, fsdp=ranks).fits(small)
    assert ranks == 2 or not memory_footprint(model, ids, train="adamw", device=small, fsdp=ranks // 2).fits(small)
    assert main(command + ["--format", "json"]) == 2
    document = json.loads(capsys.readouterr().out)
    assert document["memory"]["largest_batch"] == 0 and document["memory"]["peak"] == at_one.peak
    assert {lever["lever"] for lever in document["memory"]["what_would_fit"]} == set(rows)


class _HidesItsInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.kept = y  # not through save_for_backward: no saved-tensor hook sees it
        return y * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2 * ctx.kept


class _Hiding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 8)

    def forward(self, x):
        return _HidesItsInput.apply(self.inner(x))


def test_saved_activations_no_hook_sees_are_reported_per_module():
    model = nn.Sequential(nn.Linear(8, 8), _Hiding())
    estimate = memory_footprint(model, torch.randn(4, 8), train="sgd")
    assert estimate.unseen_saved_modules == ["1"]
    assert estimate.modules["1"].unseen_saved == 4 * 8 * FP32
    assert "unseen by saved-tensor hooks" in memory_summary(estimate)


def test_bad_input_is_named_and_the_model_comes_back_as_it_was():
    model, x = _mlp()
    hooks = len(model[0]._forward_hooks)
    with pytest.raises(UnknownOptimizerError, match="adamw, adafactor, adam8bit"):
        memory_footprint(model, x, train="adamz")
    with pytest.raises(DeviceSpecError, match="h100"):
        memory_footprint(model, x, device="h1000")
    assert len(model[0]._forward_hooks) == hooks and all(p.grad is None for p in model.parameters()) and model.training
    broken = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(512, 256))
    with pytest.raises(TraceError, match=r"estimating memory failed in .*2.* \(Linear\)"):
        memory_footprint(broken, x, train="adamw")
    assert all(p.grad is None for p in broken.parameters()) and broken.training

    class CalledWhileHandling(nn.Module):  # as GroupViT's vision tower: a module called inside an except clause
        def __init__(self) -> None:
            super().__init__()
            self.first, self.norm = nn.Linear(4, 4), nn.BatchNorm1d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            try:
                raise KeyError("not cached")
            except KeyError:
                hidden = self.first(x)
            return self.norm(hidden)
    # a batch of 1 in training: the norm raises; until 2026-12-07 the estimate named the module the handled KeyError had "left"
    with pytest.raises(TraceError, match=r"estimating memory failed in module 'norm' \(BatchNorm1d\): ValueError: Expected more than 1 value"):
        memory_footprint(CalledWhileHandling(), torch.randn(1, 4), train="adamw")


def test_the_table_and_the_cli(capsys):
    model, x = _mlp()
    table = memory_table(memory_footprint(model, x, train="adamw"))
    assert "saved activations" in table and "256.00 KiB" in table
    code = main(["transformers:LlamaForCausalLM", "--config", "hidden_size=64", "intermediate_size=128", "num_hidden_layers=1",
                 "num_attention_heads=4", "num_key_value_heads=2", "vocab_size=100", "--input-ids", "2,32", "--train", "adamw", "--device", "h100"])
    out = capsys.readouterr().out
    assert code == 0 and "Memory of a training step (adamw)" in out and "fits in h100-sxm (80.00 GiB)" in out
    assert main(["--example", "convnet", "--train", "adamz"]) == 2
    assert "known: sgd, sgd-momentum, adam, adamw" in capsys.readouterr().err
    assert main(["--example", "convnet", "--fit", "batch"]) == 2
    assert "--fit needs a device with a memory size" in capsys.readouterr().err


LLAMA_SETTINGS = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}


@pytest.mark.parametrize("flags, dtype, ids, options", [
    (["--train", "adamw", "--checkpointing", "--dtype", "bfloat16", "--master-weights", "--autocast", "bfloat16"], torch.bfloat16, (2, 32),
     {"train": "adamw", "checkpointing": True, "master_weights": True, "autocast": torch.bfloat16}),
    (["--memory", "--kv-cache", "64"], torch.float32, (1, 16), {"kv_cache_length": 64}),
    (["--train", "sgd", "--fsdp", "2", "--tp", "2"], torch.float32, (2, 32), {"train": "sgd", "fsdp": 2, "tensor_parallel": 2}),
], ids=["mixed-precision-checkpointed-step", "kv-cache", "fsdp-by-tp"])
def test_every_memory_flag_reaches_the_estimate(capsys, flags, dtype, ids, options):
    """The command line's memory is the API's estimate with the options its flags name, on the model
    as the command line builds it (from its config, on meta, in --dtype): a flag it dropped would
    change the estimate's settings, if not its bytes."""
    transformers = pytest.importorskip("transformers")
    assert main(["transformers:LlamaForCausalLM", "--config", *(f"{key}={value}" for key, value in LLAMA_SETTINGS.items()), "--input-ids", ",".join(map(str, ids)),
                 "--quiet", "--format", "json", *flags]) == 0
    estimated = json.loads(capsys.readouterr().out)["memory"]
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_SETTINGS)).to(dtype)
    expected = memory_footprint(model, torch.zeros(ids, dtype=torch.long, device="meta"), **options)
    assert estimated == json.loads(json.dumps(expected.to_dict()))


def test_the_table_shows_each_module_by_its_full_name_indented_by_depth():
    table = memory_table(memory_footprint(_llama(), torch.zeros(1, 16, dtype=torch.long)), max_depth=3)
    labels = [line.split("|")[1].rstrip() for line in table.splitlines()[2:]]
    assert labels[:5] == [" (model)", "  model", "   model.embed_tokens", "   model.layers", "    model.layers.0"]
    assert "    model.layers.1" in labels and "  lm_head" in labels


def test_the_deepspeed_printout_gives_the_peak_and_each_modules_memory(capsys):
    model, x = _mlp()
    estimate = memory_footprint(model, x, train="adamw")
    parameters = (256 * 1024 + 1024 + 1024 * 256 + 256) * FP32
    profiler = FlopsProfiler(model)
    profiler.start_profile()
    model(x)
    profiler.print_model_profile(memory=estimate)
    profiler.end_profile()
    out = capsys.readouterr().out
    assert _printed(out, "memory peak per GPU (estimated: training step, adamw; in the optimizer)") == deepspeed_bytes(estimate.peak)
    assert _printed(out, "memory at peak: parameters") == _printed(out, "memory at peak: gradients") == deepspeed_bytes(parameters) == "2.1 MB"
    assert _printed(out, "memory at peak: optimizer state") == deepspeed_bytes(2 * parameters + 4 * FP32)
    linear = 256 * 1024 + 1024
    assert f"(0): Linear({deepspeed_params(linear)} = " in out and f"{deepspeed_bytes(4 * linear * FP32 + 2 * FP32)} memory" in out  # weight, grad, 2 states, 2 steps
    assert f"{deepspeed_bytes(64 * 1024 * FP32)} memory" in out  # the ReLU: its saved output only
    code = main(["--example", "convnet", "--profile", "--train", "sgd", "--device", "cpu", "--repeats", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "memory peak per GPU (estimated: training step, sgd" in out and "Memory of a training step" not in out  # the printout says it, once


def _printed(out: str, label: str) -> str:
    """The value DeepSpeed's printout gives after ``label: ``."""
    return next(line[len(label) + 1:].strip() for line in out.splitlines() if line.startswith(label + ":"))


def _sharded_rank(rank: int, world: int, store: str, folder: str, estimates: dict[str, int]) -> None:
    """One of 4 gloo ranks on a 2 x 2 mesh of a real Llama split by its own tensor-parallel plan over
    ``tp`` (``tp`` modes), with FSDP2 over ``dp`` on top (``fsdp_tp``): MemTracker's least peak of 2
    steady steps."""
    from torch.distributed.fsdp import fully_shard

    from jitflops.estimates.fake_sharding import sharding_units

    torch.distributed.init_process_group("gloo", init_method=store, rank=rank, world_size=world)
    try:
        mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        peaks = {}
        for mode in estimates:
            model = _llama()
            shard_like_tensor_parallel(model, mesh["tp"])
            if mode == "fsdp_tp":
                for unit in sharding_units(model):
                    fully_shard(unit, mesh=mesh["dp"])
                fully_shard(model, mesh=mesh["dp"])
            ids = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(0))
            optimizer = torch.optim.AdamW(model.parameters()) if mode != "inference" else None
            model.train(optimizer is not None)

            def step() -> None:
                with torch.set_grad_enabled(optimizer is not None):
                    output = model(input_ids=ids, labels=ids)
                if optimizer is not None:
                    output.loss.backward()
                    del output
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                else:
                    del output
            step()
            # gloo's thread may hold a collective's buffer a little longer: the least of 2 steps
            peaks[mode] = min(memtracker_peak(step, model, optimizer) for _ in range(2)) + 2 * ids.nbytes
        (Path(folder) / f"rank{rank}.json").write_text(json.dumps(peaks))
    finally:
        torch.distributed.destroy_process_group()


def test_tensor_parallel_and_fsdp2_by_tensor_parallel_shard_per_rank_by_hand_and_on_four_gloo_ranks(tmp_path):
    model = _llama()
    ids = torch.randint(0, 1000, (2, 64))
    inputs = {"input_ids": ids, "labels": ids}
    whole = memory_footprint(model, inputs, train="adamw")
    sharded = memory_footprint(model, inputs, train="adamw", tensor_parallel=2)
    estimates = {"inference": memory_footprint(model, inputs, tensor_parallel=2)}  # tensor parallelism's AdamW step: tools/memory_accuracy.py --tp
    norms = sum(p.numel() for name, p in model.named_parameters() if "norm" in name)  # replicated; every other weight is split in 2
    assert sharded.model.parameters == FP32 * ((sum(p.numel() for p in model.parameters()) - norms) // 2 + norms)
    # torch's vocabulary-parallel embedding gives its weight a Replicate gradient: the whole table on each rank
    assert sharded.model.gradients == sharded.model.parameters + FP32 * 1000 * 128 // 2
    assert sharded.modules["model.embed_tokens"].gradients == FP32 * 1000 * 128
    assert sharded.modules["model.layers.0.self_attn.q_proj"].parameters == FP32 * 128 * 128 // 2
    assert sharded.peak < whole.peak and sharded.settings["tensor_parallel"] == 2
    # a 2-D mesh: FSDP2 shards each rank's tensor-parallel shard (the norms too) over 2 more, gradients with them
    estimates["fsdp_tp"] = both = memory_footprint(model, inputs, train="adamw", fsdp=2, tensor_parallel=2)
    assert both.model.parameters == both.model.gradients == sum(
        FP32 * math.ceil(p.numel() // (1 if "norm" in name else 2) / 2) for name, p in model.named_parameters())
    assert both.settings["fsdp"] == both.settings["tensor_parallel"] == 2 and both.peak < sharded.peak
    assert not torch.distributed.is_initialized()
    run_on_ranks(_sharded_rank, 4, 4, process_group_file(str(tmp_path)), str(tmp_path), {mode: e.peak for mode, e in estimates.items()})
    for rank in range(4):
        measured = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for mode, estimate in estimates.items():
            assert estimate.peak == pytest.approx(measured[mode], rel=0.001), (rank, mode)
    with pytest.raises(ShardingError, match="GPT2LMHeadModel has no tensor-parallel plan"):
        memory_footprint(transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100)), ids[:, :8], tensor_parallel=2)


def test_a_tensor_parallel_models_step_on_a_gpu_takes_the_optimizer_torch_can_run():
    """A tensor-parallel Llama's norms stay plain tensors beside its DTensor weights. torch's default
    on a GPU is the multi-tensor AdamW, whose first op DTensor refuses over such a list (here with
    ``foreach=True`` forced, the estimate's fake step raises as a real one does); the estimate on a
    GPU steps such a model with the for-loop AdamW, as a run that trains it must (it raised before
    2026-11-29, on the Llama-3-8B at tensor parallelism 8 too)."""
    model = _llama()
    ids = torch.randint(0, 1000, (2, 64))
    inputs = {"input_ids": ids, "labels": ids}
    with pytest.raises(TraceError, match="mixed torch.Tensor and DTensor"):
        memory_footprint(model, inputs, train=lambda params: torch.optim.AdamW(params, foreach=True), tensor_parallel=2, device="h100")
    on_gpu = memory_footprint(model, inputs, train="adamw", tensor_parallel=2, device="h100")
    for_loop = memory_footprint(model, inputs, train=lambda params: torch.optim.AdamW(params, foreach=False), tensor_parallel=2, device="h100")
    assert on_gpu.peak == for_loop.peak and on_gpu.settings["tensor_parallel"] == 2


