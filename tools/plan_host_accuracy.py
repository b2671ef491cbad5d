"""The training plan's compute and optimizer step against a sharded model's real step on one process,
where no collective moves data: what DTensor and the optimizer cost the host, apart from the loopback.

A plan's step on gloo ranks (``tools/plan_gloo_accuracy.py``) mixes the loopback's collectives,
which move by tens of percent from run to run on a VM, with the compute. Here the small GPT of
``tests/sharded_cases.small_gpt`` (4 blocks of width 256, float32, 4 sequences of 128 tokens) runs
its training step on torch's fake process group of 2 ranks (every collective completes at once),
on one thread, as one rank of a run of 2 would: plain, by tensor parallelism (the model's own plan:
its parameters are DTensors, its ops DTensor's) and by FSDP2 (each block, then the root). Each
round calibrates the CPU afresh (``jitflops calibrate`` on one thread), times the layouts taking
their steps in turn (the median of 5 steps after 2, the forward with the backward, and AdamW's
step apart), and plans the same layouts on that spec (the forward and backward planned: the compute and
FSDP2's buffer copies); an error is the median over the rounds. The
ratio of each sharded layout's forward and backward to the plain one's, within one round, is the
figure the machine's drift does not move.

    python tools/plan_host_accuracy.py              # 3 rounds, about 4 minutes
    python tools/plan_host_accuracy.py --rounds 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import torch  # noqa: E402

from jitflops.estimates.fake_sharding import fake_process_group, shard_like_tensor_parallel, sharding_units  # noqa: E402
from jitflops.planning.plan import plan_training  # noqa: E402
from jitflops.timing.calibration import calibrate  # noqa: E402

SEQUENCE, MICRO_BATCH, STEPS = 128, 4, 5
LAYOUTS = {"plain": (1, 1, 0), "tensor_parallel": (2, 1, 1), "fsdp2": (1, 2, 3)}
"""name: (tp, dp, zero) of a run of 2 ranks (plain: one rank's whole model, as DDP's compute)."""


def _timed() -> dict[str, tuple[float, float]]:
    """Each layout's median (forward and backward, optimizer step) seconds, the layouts stepping in turn."""
    from sharded_cases import small_gpt
    from torch.distributed.fsdp import fully_shard

    ids = torch.randint(0, 1024, (MICRO_BATCH, SEQUENCE), generator=torch.Generator().manual_seed(0))
    with fake_process_group(2) as mesh:
        runs = {}
        for layout in LAYOUTS:
            model = small_gpt()
            if layout == "tensor_parallel":
                shard_like_tensor_parallel(model, mesh)
            elif layout == "fsdp2":
                for unit in sharding_units(model):
                    fully_shard(unit, mesh=mesh)
                fully_shard(model, mesh=mesh)
            runs[layout] = (model, torch.optim.AdamW(model.parameters()))
        passes: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
        steps: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
        for step in range(STEPS + 2):
            for layout, (model, optimizer) in runs.items():
                started = time.perf_counter()
                model(input_ids=ids, labels=ids).loss.backward()
                middle = time.perf_counter()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if step >= 2:
                    passes[layout].append(middle - started)
                    steps[layout].append(time.perf_counter() - middle)
    return {layout: (statistics.median(passes[layout]), statistics.median(steps[layout])) for layout in LAYOUTS}


def _planned(layout: str, spec: str) -> tuple[float, float]:
    from sharded_cases import small_gpt

    tp, dp, zero = LAYOUTS[layout]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = plan_training(small_gpt("meta"), SEQUENCE, MICRO_BATCH * dp, spec, tp * dp, "dgx-h100", tp=tp, dp=dp, zero=zero,
                             micro_batch=MICRO_BATCH, sequence_parallel=False, tp_overlap=False)
    # FSDP2's copies into and out of its buffers are in the data-parallel part, beside its collectives,
    # which cost nothing on the fake group and about 0.1 ms on the plan's NVLink
    return plan.breakdown.compute_s + plan.breakdown.data_parallel_s, plan.breakdown.optimizer_s


def one_round(folder: str, index: int) -> dict:
    spec = str(Path(folder, f"spec{index}.json"))
    Path(spec).write_text(calibrate("cpu").to_json())
    measured = _timed()
    planned = {layout: _planned(layout, spec) for layout in LAYOUTS}
    host = json.loads(Path(spec).read_text())["host_s"]
    return {"measured": measured, "planned": planned, "dtensor_us": host.get("dtensor", 0) * 1e6, "parallel_dtensor_us": host.get("parallel_dtensor", 0) * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=str(REPO / "tools" / "plan_host_results.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        rounds = [one_round(folder, index) for index in range(args.rounds)]
    rows = {}
    for layout in LAYOUTS:
        row = {}
        for part, position in (("forward_backward", 0), ("optimizer", 1)):
            errors = [each["planned"][layout][position] / each["measured"][layout][position] - 1 for each in rounds]
            row[part] = {"measured_s": statistics.median(each["measured"][layout][position] for each in rounds),
                         "error": statistics.median(errors), "range": [min(errors), max(errors)]}
        if layout != "plain":
            row["ratio_to_plain"] = {
                "measured": statistics.median(each["measured"][layout][0] / each["measured"]["plain"][0] for each in rounds),
                "planned": statistics.median(each["planned"][layout][0] / each["planned"]["plain"][0] for each in rounds)}
        rows[layout] = row
        parts = "  ".join(f"{part} {figures['measured_s'] * 1e3:6.1f} ms {figures['error']:+.0%} ({figures['range'][0]:+.0%} to {figures['range'][1]:+.0%})"
                          for part, figures in row.items() if part != "ratio_to_plain")
        ratio = row.get("ratio_to_plain")
        print(f"{layout:16} {parts}" + (f"  forward+backward / plain: measured {ratio['measured']:.2f}, planned {ratio['planned']:.2f}" if ratio else ""))
    Path(args.output).write_text(json.dumps({"rows": rows, "rounds": rounds, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
