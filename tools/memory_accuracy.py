"""The memory estimate against torch's own accounting of real steps on this CPU.

For each transformers model (small configs, random weights) and each of inference, an AdamW
training step and an AdamW step with activation checkpointing, ``memory_footprint`` estimates the
peak on fake tensors; the same step then runs for real, a steady one (after a first step made the
optimizer's state), measured twice: by ``MemTracker`` (``torch.distributed._tools``; it does not see
the inputs, made before it started, so their bytes are added) and by ``torch.profiler``'s memory
timeline (``profile_memory=True``). Errors are the estimate over each, less one.

    python tools/memory_accuracy.py                    # writes tools/memory_results.json
    torchrun --nproc_per_node 2 tools/memory_accuracy.py --fsdp   # FSDP2 on 2 gloo ranks (and 4)
    torchrun --nproc_per_node 2 tools/memory_accuracy.py --tp     # tensor parallelism, the models' own plans
    torchrun --nproc_per_node 4 tools/memory_accuracy.py --fsdp --tp   # FSDP2 over 2 by tensor parallelism over 2
    python tools/memory_accuracy.py --scale            # Llama-3-8B at 4,096 tokens: seconds
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import transformers
from torch.distributed._tools.mem_tracker import MemTracker
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import MemoryProfileTimeline

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from jitflops.core.errors import TraceError  # noqa: E402
from jitflops.estimates.fake_sharding import ShardingError, shard_like_tensor_parallel, sharding_units  # noqa: E402
from jitflops.estimates.memory_footprint import memory_footprint  # noqa: E402

SMALL = dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
             max_position_embeddings=512)
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("causal", SMALL),
    "mistral": ("causal", SMALL),
    "qwen2": ("causal", SMALL),
    "qwen3": ("causal", {**SMALL, "head_dim": 32}),
    "gemma": ("causal", {**SMALL, "head_dim": 32}),
    "phi3": ("causal", {**SMALL, "pad_token_id": 0}),
    "gpt2": ("causal", dict(n_embd=128, n_layer=2, n_head=4, vocab_size=1000, n_positions=512)),
    "opt": ("causal", dict(hidden_size=128, ffn_dim=344, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000, word_embed_proj_dim=128)),
    "bert": ("masked", dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000)),
    "roberta": ("masked", dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000)),
    "t5": ("seq2seq", dict(d_model=128, d_ff=344, num_layers=2, num_heads=4, d_kv=32, vocab_size=1000, decoder_start_token_id=0, pad_token_id=0)),
    "mixtral": ("causal", {**SMALL, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen3_moe": ("causal", {**SMALL, "head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 96}),
    "deepseek_v3": ("causal", dict(hidden_size=128, intermediate_size=344, moe_intermediate_size=96, num_hidden_layers=2, first_k_dense_replace=1,
                                   num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                   n_group=1, topk_group=1, q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16,
                                   v_head_dim=32, vocab_size=1000, max_position_embeddings=512)),
}
MIXTURES_OF_EXPERTS = ("mixtral", "qwen3_moe", "deepseek_v3")
"""Measured in float32 (as ``from_config`` builds them) and in bfloat16: transformers' experts run a
grouped product (``torch._grouped_mm``) in both, whose meta kernel in torch takes bfloat16 alone."""
MODES = ("inference", "adamw", "checkpointing")
BATCH, LENGTH = 4, 128


def build(name: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    head, settings = MODELS[name]
    config = transformers.AutoConfig.for_model(name, **settings)
    auto = {"causal": transformers.AutoModelForCausalLM, "masked": transformers.AutoModelForMaskedLM, "seq2seq": transformers.AutoModelForSeq2SeqLM}[head]
    torch.manual_seed(0)
    return auto.from_config(config, attn_implementation="sdpa").to(dtype)


def dtypes_of(name: str) -> tuple[torch.dtype, ...]:
    return (torch.float32, torch.bfloat16) if name in MIXTURES_OF_EXPERTS else (torch.float32,)


def batch(batch_size: int = BATCH) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 1000, (batch_size, LENGTH), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def real_step(model: torch.nn.Module, inputs: dict[str, torch.Tensor], mode: str) -> tuple[Callable[[], None], Any]:
    """The step the estimate models, and the optimizer (None for inference)."""
    if mode == "inference":
        model.eval()

        def infer() -> None:
            # The output is kept to the end of the step, and dropped before the next one (else the
            # next measurement starts with it: the profiler's timeline counts what exists before it)
            with torch.no_grad():
                output = model(**inputs)
            del output
        return infer, None
    model.train()
    if mode == "checkpointing":
        model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters())

    def train() -> None:
        output = model(**inputs)
        output.loss.backward()
        del output
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    train()  # the optimizer's state, as in a steady step
    return train, optimizer


def memtracker_peak(model: torch.nn.Module, optimizer: Any, step: Callable[[], None], extra: int) -> int:
    tracker = MemTracker()
    tracker.track_external(*([model, optimizer] if optimizer is not None else [model]))
    with tracker:
        step()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"] + extra


def profiler_peak(step: Callable[[], None]) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    return max(sum(row) for row in sizes)


def measure(name: str, mode: str, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    model, inputs = build(name, dtype), batch()
    started = time.perf_counter()
    estimate = memory_footprint(model, inputs, train=None if mode == "inference" else "adamw", checkpointing=mode == "checkpointing")
    seconds = time.perf_counter() - started
    step, optimizer = real_step(model, inputs, mode)
    input_bytes = sum(t.untyped_storage().nbytes() for t in inputs.values())
    tracked = memtracker_peak(model, optimizer, step, input_bytes)
    timeline = profiler_peak(step)
    return {"model": name, "mode": mode, "dtype": str(dtype).removeprefix("torch."), "estimate": estimate.peak, "peak_phase": estimate.peak_phase, "memtracker": tracked, "profiler": timeline,
            "error_vs_memtracker": estimate.peak / tracked - 1, "error_vs_profiler": estimate.peak / timeline - 1, "estimate_s": round(seconds, 3)}


def sharded(kind: str) -> None:
    """Each model sharded over the ranks, ``kind`` ``fsdp`` (FSDP2, an AdamW step), ``tp``
    (tensor parallelism by the model's own plan, inference and an AdamW step) or ``fsdp_tp`` (a 2-D
    mesh: FSDP2 over half the ranks of a model split over 2 by its plan, an AdamW step); rank 0's estimate
    (made before the process group, on a fake one) against what MemTracker measures on each rank.
    A model whose plan torch cannot apply, or whose heads do not divide over the ranks, is listed
    with the reason."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = int(os.environ.get("WORLD_SIZE", "1"))
    cases = [(name, mode) for name in MODELS for mode in (("inference", "adamw") if kind == "tp" else ("adamw",))]
    option = {"fsdp": {"fsdp": world}, "tp": {"tensor_parallel": world}, "fsdp_tp": {"fsdp": world // 2, "tensor_parallel": 2}}[kind]
    estimates: dict[tuple[str, str], Any] = {}
    for name, mode in cases:
        try:
            estimates[name, mode] = memory_footprint(build(name), batch(2), train=None if mode == "inference" else "adamw", **option).peak
        except (ShardingError, TraceError) as error:
            estimates[name, mode] = str(error).splitlines()[0]
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp")) if kind == "fsdp_tp" else init_device_mesh("cpu", (world,))
    data_mesh, model_mesh = (mesh["dp"], mesh["tp"]) if kind == "fsdp_tp" else (mesh, mesh)
    rows = []

    def label(mode: str) -> str:
        return {"tp": f"tp x{world} {mode}", "fsdp": f"fsdp2 x{world}", "fsdp_tp": f"fsdp2 x{world // 2} by tp x2"}[kind]

    for name, mode in cases:
        estimate = estimates[name, mode]
        if isinstance(estimate, str):
            rows.append({"model": name, "mode": label(mode), "not_estimated": estimate})
            continue
        model = build(name)
        if kind != "fsdp":
            shard_like_tensor_parallel(model, model_mesh)
        if kind != "tp":
            for unit in sharding_units(model):
                fully_shard(unit, mesh=data_mesh)
            fully_shard(model, mesh=data_mesh)
        inputs = batch(2)
        step, optimizer = real_step(model, inputs, mode)
        step()  # a steady step: a rank's first forward or backward of a process held up to 1.5 MB more, once
        extra = sum(t.untyped_storage().nbytes() for t in inputs.values())
        # gloo runs collectives on a thread of its own, which drops its hold on their buffers when it
        # gets to it: a step's peak varies by up to a buffer (1 MB here) from one step to the next
        tracked = [memtracker_peak(model, optimizer, step, extra) for _ in range(3)]
        lows, highs = [None] * world, [None] * world
        dist.all_gather_object(lows, min(tracked))
        dist.all_gather_object(highs, max(tracked))
        rows.append({"model": name, "mode": label(mode), "estimate": estimate,
                     "memtracker_per_rank": highs, "memtracker_least_per_rank": lows, "error_vs_memtracker": estimate / max(highs) - 1,
                     "error_vs_least": estimate / max(lows) - 1})
    if dist.get_rank() == 0:
        print(json.dumps(rows, indent=1))
        write({f"{ {'fsdp': 'fsdp2', 'tp': 'tensor_parallel', 'fsdp_tp': 'fsdp2_by_tensor_parallel'}[kind]}_{world}_ranks": rows})
    dist.barrier()  # else a rank leaving while rank 0 writes aborts gloo ("terminate called without an active exception")
    dist.destroy_process_group()


def scale() -> None:
    """Llama-3-8B's shape (built on meta) at 4,096 tokens: the estimate's wall time and its figures."""
    config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                      vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0)
    rows = []
    for label, options in (("inference bf16", dict(dtype=torch.bfloat16)),
                           ("adamw bf16, fp32 master weights", dict(dtype=torch.bfloat16, train="adamw", master_weights=True)),
                           ("adamw bf16, checkpointing", dict(dtype=torch.bfloat16, train="adamw", checkpointing=True))):
        started = time.perf_counter()
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(config)
            ids = torch.zeros(1, 4096, dtype=torch.long)
        built = time.perf_counter()
        estimate = memory_footprint(model, {"input_ids": ids, "labels": ids}, device="h100", **options)
        done = time.perf_counter()
        rows.append({"case": label, "peak_gib": round(estimate.peak / 2**30, 2), "fits_h100": estimate.fits("h100"), "build_s": round(built - started, 2),
                     "estimate_s": round(done - built, 2)})
        print(rows[-1])
    write({"llama3_8b_4096_tokens": rows})


def write(update: dict[str, Any]) -> None:
    path = Path(__file__).with_name("memory_results.json")
    document = json.loads(path.read_text()) if path.exists() else {}
    document.update(update)
    document["torch"] = torch.__version__
    document["transformers"] = transformers.__version__
    path.write_text(json.dumps(document, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 under torchrun (gloo)")
    parser.add_argument("--tp", action="store_true", help="tensor parallelism (the models' own plans) under torchrun (gloo)")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--scale", action="store_true", help="Llama-3-8B's shape at 4,096 tokens on meta: the estimate's time")
    args = parser.parse_args()
    if args.scale:
        scale()
        return
    if args.fsdp or args.tp:
        sharded("fsdp_tp" if args.fsdp and args.tp else "fsdp" if args.fsdp else "tp")
        return
    rows = []
    for name in args.models:
        for dtype, mode in [(dtype, mode) for dtype in dtypes_of(name) for mode in MODES]:
            row = measure(name, mode, dtype)
            rows.append(row)
            print(f"{name:11} {row['dtype']:8} {mode:13} estimate {row['estimate']:>11,} memtracker {row['memtracker']:>11,} ({row['error_vs_memtracker']:+.2%}) "
                  f"profiler {row['profiler']:>11,} ({row['error_vs_profiler']:+.2%}) {row['estimate_s']:.2f}s")
    # a run of some models replaces their rows and keeps the others'
    path = Path(__file__).with_name("memory_results.json")
    earlier = json.loads(path.read_text()).get("single_process", []) if path.exists() else []
    measured = {(row["model"], row["mode"], row["dtype"]) for row in rows}
    write({"single_process": [row for row in earlier if (row["model"], row["mode"], row.get("dtype", "float32")) not in measured] + rows})


if __name__ == "__main__":
    main()
