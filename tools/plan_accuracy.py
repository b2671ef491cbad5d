"""The training plan's error against published throughput it was never fitted on.

Megatron-LM's weak-scaling table on H100 (``jitflops.planning.published_runs``, transcribed in
``shared/references/``): each row's GPT is built on the meta device from its published shape, and
planned in its published layout (tp, pp, dp, global batch, sequence 4096) on the ``h100`` datasheet
spec and the ``dgx-h100`` interconnect, with the assumptions the table leaves open stated there
(one-sequence micro-batches, 1F1B, sequence parallelism with tensor parallelism, no recomputation,
a distributed optimizer). Nothing is measured here: the figures are the datasheets' and the cost
model's. Then the 70B and 177B rows' GPUs are searched (``best_layouts``): where the published
layout ranks, and how long the search took. Prints the table ``docs/plan.md`` keeps and writes the
figures as JSON.

    python tools/plan_accuracy.py                 # all 9 rows, and the 70B and 177B rows' searches (about two minutes)
    python tools/plan_accuracy.py --rows 1.7B 70B --search
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jitflops.planning.plan import Planner  # noqa: E402
from jitflops.planning.published_runs import MEGATRON_H100, SEQUENCE  # noqa: E402
from jitflops.planning.search import best_layouts  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", default=[run.name for run in MEGATRON_H100], choices=[run.name for run in MEGATRON_H100])
    parser.add_argument("--search", nargs="*", default=["70B", "177B"], help="rows whose GPUs are searched: where their published layout ranks")
    parser.add_argument("--output", default=str(REPO / "tools" / "plan_results.json"))
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    results = []
    print("| model | GPUs | tp | pp | dp | published TFLOP/s/GPU | planned | error | step (s) | compute | bubble | exposed dp | memory/GPU (GiB) | fits 80 GB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for run in MEGATRON_H100:
        if run.name not in args.rows:
            continue
        started = time.perf_counter()
        plan = Planner(run.model(), SEQUENCE, run.global_batch, "h100", "dgx-h100").plan(run.layout())
        error = plan.model_tflops_per_gpu / run.tflops_per_gpu - 1
        b = plan.breakdown
        results.append({"model": run.name, "gpus": run.gpus, "published_tflops_per_gpu": run.tflops_per_gpu, "planned_tflops_per_gpu": plan.model_tflops_per_gpu,
                        "error": error, "plan": plan.to_dict(), "seconds": time.perf_counter() - started})
        print(f"| {run.name} | {run.gpus} | {run.tp} | {run.pp} | {run.dp} | {run.tflops_per_gpu} | {plan.model_tflops_per_gpu:.1f} | {error:+.1%} | {plan.step_s:.2f} | "
              f"{b.compute_s:.2f} | {b.bubble_s:.2f} | {b.data_parallel_s:.3f} | {plan.memory_per_gpu_bytes / 2**30:.1f} | {'yes' if plan.fits else 'no'} |", flush=True)
    errors = [row["error"] for row in results]
    summary = {"median_abs_error": statistics.median(abs(value) for value in errors), "lowest": min(errors), "highest": max(errors),
               "within_15_percent": sum(abs(value) <= 0.15 for value in errors), "rows": len(errors)}
    print(f"\nmedian |error| {summary['median_abs_error']:.1%}; from {summary['lowest']:+.1%} to {summary['highest']:+.1%}; "
          f"{summary['within_15_percent']} of {summary['rows']} rows within 15%")
    searches = []
    for run in MEGATRON_H100:
        if run.name not in args.search:
            continue
        started = time.perf_counter()
        found = best_layouts(Planner(run.model(), SEQUENCE, run.global_batch, "h100", "dgx-h100"), run.gpus)
        seconds = time.perf_counter() - started
        published = run.layout()
        rank = next(index for index, plan in enumerate(found.plans, 1) if plan.layout == published)
        slower = found.plans[rank - 1].step_s / found.plans[0].step_s - 1
        searches.append({"model": run.name, "gpus": run.gpus, "layouts": len(found.plans), "published_rank": rank, "slower_than_first": slower,
                         "first": found.plans[0].layout.describe(), "seconds": seconds})
        print(f"search {run.name} on {run.gpus} GPUs: {len(found.plans)} layouts in {seconds:.1f} s; the published layout ranks {rank} "
              f"({slower:+.1%} of the first: {found.plans[0].layout.describe()})", flush=True)
    Path(args.output).write_text(json.dumps({"rows": results, "summary": summary, "searches": searches}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
