"""The training plan's memory per GPU against the memory estimate of the whole model on its mesh.

A plan never runs the whole model: it lifts the recorded step of a copy with three blocks of each
kind to all of them (``jitflops.planning.step_peak``). The fake-tensor estimate of the whole model,
sharded as the layout shards it (``memory_footprint(..., tensor_parallel=tp, fsdp=dp)``, within
0.02% of ``MemTracker`` on real gloo ranks), is the independent figure: one micro-batch per step,
where the plan's layouts and the estimate's step are the same step; and the same estimate on the
H100 (``device="h100"``: the CUDA caching allocator's rounding, torch's ``foreach`` AdamW), where the
plan's copy is recorded as on a CPU. Each model is built on meta from its shape; nothing is
allocated. Prints the table ``docs/plan.md`` keeps and writes JSON.

    python tools/plan_memory_accuracy.py           # about a minute
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import transformers  # noqa: E402

from jitflops.estimates.memory_footprint import memory_footprint  # noqa: E402
from jitflops.planning.plan import plan_training  # noqa: E402

SHAPES = {  # name: (transformers model type, its config)
    "Llama-3-8B": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)),
    "Llama, 8 blocks of 1,024": ("llama", dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                                               vocab_size=32000)),
    "Qwen2-MoE, 8 blocks, dense and MoE in turn": ("qwen2_moe", dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=128, shared_expert_intermediate_size=256,
                                                                     num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, num_experts=4,
                                                                     num_experts_per_tok=2, decoder_sparse_step=2, vocab_size=1024)),
}
LLAMA_8B, LLAMA_SMALL, QWEN2_MOE = SHAPES
CASES = (  # (shape, sequence, micro-batch, tp, dp (FSDP2), recompute)
    [(LLAMA_8B, 4096, 1, tp, dp, "none") for tp, dp in ((2, 4), (1, 8), (8, 1))]
    + [(LLAMA_SMALL, 1024, 1, tp, dp, "none") for tp, dp in ((1, 1), (2, 1), (4, 1), (2, 4))]
    + [(LLAMA_SMALL, 2048, 2, 2, 2, "none")]
    + [(LLAMA_SMALL, 1024, 1, tp, dp, "full") for tp, dp in ((2, 1), (1, 4))]
    + [(QWEN2_MOE, 512, 1, 1, dp, "none") for dp in (1, 4)]
)
COLUMNS = ("model", "tokens", "micro-batch", "tp", "FSDP2 over", "recompute", "planned (GiB)", "whole model's estimate (GiB)", "error", "bytes off",
           "error against it on the H100 (its allocator's rounding, foreach AdamW)", "plan (s)", "estimate (s)")


def _case(shape: str, sequence: int, micro_batch: int, tp: int, dp: int, recompute: str) -> dict[str, Any]:
    model_type, config = SHAPES[shape]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(model_type, **config), dtype=torch.bfloat16)
    started = time.perf_counter()
    plan = plan_training(model, sequence, micro_batch * dp, "h100", tp * dp, tp=tp, dp=dp, zero=3 if dp > 1 else 0, micro_batch=micro_batch,
                         sequence_parallel=False, recompute=recompute)
    planned_s = time.perf_counter() - started
    ids = torch.zeros(micro_batch, sequence, dtype=torch.long, device="meta")
    started = time.perf_counter()
    sharding = {"train": "adamw", "tensor_parallel": tp if tp > 1 else None, "fsdp": dp if dp > 1 else None, "checkpointing": recompute == "full"}
    estimate = memory_footprint(model, {"input_ids": ids, "labels": ids}, **sharding)
    estimate_s = time.perf_counter() - started
    on_gpu = memory_footprint(model, {"input_ids": ids, "labels": ids}, device="h100", **sharding)
    return {"model": shape, "sequence": sequence, "micro_batch": micro_batch, "tp": tp, "dp": dp, "recompute": recompute,
            "planned_bytes": plan.memory_per_gpu_bytes, "estimated_bytes": estimate.peak, "error": plan.memory_per_gpu_bytes / estimate.peak - 1,
            "estimated_on_gpu_bytes": on_gpu.peak, "error_on_gpu": plan.memory_per_gpu_bytes / on_gpu.peak - 1, "plan_s": planned_s, "estimate_s": estimate_s}


def _row(row: dict[str, Any]) -> str:
    cells = [row["model"], f"{row['sequence']:,}", row["micro_batch"], row["tp"], row["dp"], row["recompute"], f"{row['planned_bytes'] / 2**30:.3f}",
             f"{row['estimated_bytes'] / 2**30:.3f}", f"{row['error']:+.4%}", f"{row['planned_bytes'] - row['estimated_bytes']:+,}", f"{row['error_on_gpu']:+.3%}",
             f"{row['plan_s']:.1f}",
             f"{row['estimate_s']:.1f}"]
    return "| " + " | ".join(map(str, cells)) + " |"


def main() -> int:
    output = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    output.add_argument("--output", default=str(REPO / "tools" / "plan_memory_results.json"), help="where the JSON goes")
    path = Path(output.parse_args().output)
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    print("| " + " | ".join(COLUMNS) + " |\n|" + "|".join("---" if column in ("model", "recompute") else "---:" for column in COLUMNS) + "|")
    rows = []
    for case in CASES:
        rows.append(_case(*case))
        print(_row(rows[-1]), flush=True)
    print(f"\nworst |error| {max(abs(row['error']) for row in rows):.4%} over {len(rows)} layouts; against the estimate on the H100 "
          f"{max(abs(row['error_on_gpu']) for row in rows):.3%}")
    path.write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
