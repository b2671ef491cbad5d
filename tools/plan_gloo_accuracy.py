"""The training plan's step time against real steps on gloo ranks of this machine.

For each world size (2 and 4 processes on the loopback):

1. ``jitflops calibrate --collectives N``'s measurement of the loopback (the interconnect), and
   ``jitflops calibrate``'s of the CPU as each rank sees it: as many processes as the cores run at
   once calibrate at once, each on ``cores // N`` threads (at least one), as the ranks of the run
   will share the cores; rank 0's spec is the device. With more ranks than that (4 on 2 cores),
   each rank runs in turn with the others, and its spec is that one for its share of the cores'
   time (``DeviceSpec.time_shared``): 4 processes calibrating at once had timed every call shorter
   than the scheduler's slice at its speed alone (the product grid's small products), and the
   4-rank plans came out 17% to 47% short.
2. A small GPT (``tests/sharded_cases.small_gpt``: 4 blocks of width 256, float32, 128 tokens a
   sequence) trains for real in each layout: DDP, FSDP2 (each block, then the root), tensor
   parallelism by the model's own plan, FSDP2 by tensor parallelism on a 2-D mesh (4 ranks), and
   a pipeline of 2 stages (``sharded_cases.pipelined_gpt``: torch's 1F1B schedule over 4
   micro-batches of 2 sequences; on 4 ranks each stage held by 2 DDP ranks), and the same
   pipeline interleaved (torch's interleaved 1F1B, 2 stages of one block on each pipeline rank). A step is a forward with the loss, its backward, AdamW's step
   and zeroing the gradients, on a micro-batch of 4 sequences per data-parallel replica (the
   pipeline: its 4 micro-batches); every rank waits at a barrier before each
   step, and a step's time is its slowest rank's. The median of the timed steps, after 2 warm-ups; the layouts take their steps in turn.
3. ``plan_training`` predicts the same layout on the calibrated CPU and loopback, with the model
   built on meta. torch's eager tensor parallelism waits for each collective where it is issued,
   so the plan is asked for tensor-parallel collectives not overlapped with compute
   (``tp_overlap=False``); transformers' plans have no sequence parallelism.

Each round calibrates both afresh and times the layouts in turn, step by step (the machine's drift
falls on each alike); a layout's error is its median over the rounds (3 by default), printed with
its range. Writes each round's rows (planned and measured step, the plan's breakdown, the link's
fit) and the medians to ``tools/plan_gloo_results.json``. About 4 minutes a round on a 2-core VM.

    python tools/plan_gloo_accuracy.py
    python tools/plan_gloo_accuracy.py --worlds 2 --rounds 1 --steps 8
"""

from __future__ import annotations

import argparse
import json
import os
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
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from jitflops.estimates.devices import device_spec  # noqa: E402
from jitflops.planning.interconnects import interconnect  # noqa: E402
from jitflops.planning.link_calibration import calibrate_collectives, free_port  # noqa: E402
from jitflops.planning.plan import plan_training  # noqa: E402

SEQUENCE = 128
MICRO_BATCH = 4
LAYOUTS = {  # name: (tp, pp, zero, virtual stages); dp is the rest of the world; None: the whole world
    "ddp": (1, 1, 0, 1),
    "fsdp2": (1, 1, 3, 1),
    "tensor_parallel": (None, 1, 1, 1),
    "fsdp2_by_tensor_parallel": (2, 1, 3, 1),
    "pipeline": (1, 2, 0, 1),  # 4 ranks: 2 stages, each held by 2 DDP ranks
    "interleaved_pipeline": (1, 2, 0, 2),  # 2 ranks of 2 stages of one block each (4 ranks: each rank's stages held by 2 DDP ranks)
}
PIPELINE_MICRO_BATCH, PIPELINE_MICRO_BATCHES = 2, 4


def _threads(world: int) -> int:
    return max(1, (os.cpu_count() or 1) // world)


def _sizes(layout: str, world: int) -> tuple[int, int, int, int, int]:
    """(tp, pp, dp, zero, virtual stages) of ``layout`` on ``world`` ranks."""
    tp, pp, zero, virtual_stages = LAYOUTS[layout]
    tp, pp = world if tp is None else tp, world if pp is None else pp
    return tp, pp, world // (tp * pp), zero, virtual_stages


def _running(world: int) -> int:
    """How many of ``world`` ranks run at a time: as many as the cores hold at their threads."""
    return min(world, max(1, (os.cpu_count() or 1) // _threads(world)))


def _calibrating_rank(rank: int, world: int, port: int, folder: str, budget: float) -> None:
    from jitflops.timing.calibration import calibrate

    torch.set_num_threads(_threads(world))
    running = _running(world)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=running)
    dist.barrier()  # as many ranks calibrate at once as will run at once,
    dist.destroy_process_group()  # and with no process group, as `jitflops calibrate` runs (FSDP2's timing makes a fake one)
    spec = calibrate("cpu", budget_s=budget)
    if rank == 0:
        Path(folder, "spec.json").write_text(spec.to_json())


def _training_rank(rank: int, world: int, port: int, folder: str, layouts: list[str], steps: int) -> None:
    from sharded_cases import pipelined_gpt, small_gpt
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from jitflops.estimates.fake_sharding import shard_like_tensor_parallel, sharding_units

    torch.set_num_threads(_threads(world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        runs = {}
        for layout in layouts:
            tp, pp, dp, zero, virtual_stages = _sizes(layout, world)
            if pp > 1:
                stage, pipelined, _ = pipelined_gpt(rank, world, PIPELINE_MICRO_BATCH, PIPELINE_MICRO_BATCHES, replicas=dp, virtual_stages=virtual_stages)
                runs[layout] = (pipelined, torch.optim.AdamW(stage.parameters()))
                continue
            mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
            model = small_gpt()
            if tp > 1:
                shard_like_tensor_parallel(model, mesh["tp"])
            if zero == 3:
                for unit in sharding_units(model):
                    fully_shard(unit, mesh=mesh["dp"])
                fully_shard(model, mesh=mesh["dp"])
            elif dp > 1:
                model = DistributedDataParallel(model)
            generator = torch.Generator().manual_seed(mesh["dp"].get_local_rank())  # each replica its own batch, each tp group the same
            ids = torch.randint(0, 1024, (MICRO_BATCH, SEQUENCE), generator=generator)
            runs[layout] = (lambda model=model, ids=ids: model(input_ids=ids, labels=ids).loss.backward(), torch.optim.AdamW(model.parameters()))
        times: dict[str, list[float]] = {layout: [] for layout in layouts}
        for step in range(steps + 2):
            for layout, (forward_and_backward, optimizer) in runs.items():  # the layouts in turn: the machine's drift falls on each alike
                dist.barrier()
                started = time.perf_counter()
                forward_and_backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if step >= 2:
                    times[layout].append(elapsed.item())
        if rank == 0:
            Path(folder, "times.json").write_text(json.dumps(times))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_world(world: int, steps: int, budget: float) -> list[dict]:
    from sharded_cases import small_gpt

    layouts = [name for name in LAYOUTS if world % _sizes(name, world)[0] == 0 and (name != "fsdp2_by_tensor_parallel" or world >= 4)]
    with tempfile.TemporaryDirectory() as folder:
        link_document = calibrate_collectives(world)
        link_path = Path(folder, "link.json")
        link_path.write_text(json.dumps(link_document))
        mp.spawn(_calibrating_rank, args=(world, free_port(), folder, budget), nprocs=_running(world), join=True)
        spec_path = str(Path(folder, "spec.json"))
        if _running(world) < world:  # each rank runs in turn with the others: it gets that share of the cores' time
            spec_path = str(Path(folder, "shared.json"))
            Path(spec_path).write_text(device_spec(str(Path(folder, "spec.json"))).time_shared(_running(world) / world).to_json())
        mp.spawn(_training_rank, args=(world, free_port(), folder, layouts, steps), nprocs=world, join=True)
        measured = json.loads(Path(folder, "times.json").read_text())
        link = interconnect(str(link_path))
        rows = []
        for layout in layouts:
            tp, pp, dp, zero, virtual_stages = _sizes(layout, world)
            micro_batch, micro_batches = (PIPELINE_MICRO_BATCH, PIPELINE_MICRO_BATCHES) if pp > 1 else (MICRO_BATCH, 1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                plan = plan_training(small_gpt("meta"), SEQUENCE, micro_batch * micro_batches * dp, spec_path, world, link, tp=tp, pp=pp, dp=dp,
                                     zero=zero, micro_batch=micro_batch, sequence_parallel=False, tp_overlap=False,
                                     schedule="interleaved" if virtual_stages > 1 else "1f1b", virtual_stages=virtual_stages)
            step = statistics.median(measured[layout])
            spread = (min(measured[layout]), max(measured[layout]))
            breakdown = plan.breakdown
            rows.append({"world": world, "layout": layout, "tp": tp, "pp": pp, "dp": dp, "zero": zero, "planned_s": plan.step_s, "measured_s": step,
                         "measured_range_s": spread, "error": plan.step_s / step - 1,
                         "breakdown": {"compute_s": breakdown.compute_s, "tensor_parallel_s": breakdown.tensor_parallel_s, "pipeline_send_s": breakdown.pipeline_send_s,
                                       "bubble_s": breakdown.bubble_s, "data_parallel_s": breakdown.data_parallel_s, "optimizer_s": breakdown.optimizer_s},
                         "link": {"bandwidth_gb_s": link.intra_node_bandwidth / 1e9, "latency_us": link.intra_node_latency_s * 1e6,
                                  "blocked_wait_us": link.blocked_wait_s * 1e6,
                                  "fit_errors": [round(point["error"], 3) for point in link_document["measured"]]}})
            print(f"{world} ranks  {layout:26} planned {plan.step_s * 1e3:7.1f} ms  measured {step * 1e3:7.1f} ms "
                  f"({spread[0] * 1e3:.1f}-{spread[1] * 1e3:.1f})  error {rows[-1]['error']:+.0%}", flush=True)
        return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", nargs="*", type=int, default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each calibrating afresh: an error is the median over them")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per layout (after 2 warm-ups)")
    parser.add_argument("--budget", type=float, default=20.0, help="each rank's CPU calibration budget, seconds")
    parser.add_argument("--output", default=str(REPO / "tools" / "plan_gloo_results.json"))
    args = parser.parse_args()
    rounds = []
    for index in range(args.rounds):
        print(f"round {index + 1}", flush=True)
        rounds.append([row for world in args.worlds for row in run_world(world, args.steps, args.budget)])
    summary = []
    for position, first in enumerate(rounds[0]):
        errors = [each[position]["error"] for each in rounds]
        summary.append({"world": first["world"], "layout": first["layout"], "error": statistics.median(errors), "errors": errors,
                        "planned_s": statistics.median(each[position]["planned_s"] for each in rounds),
                        "measured_s": statistics.median(each[position]["measured_s"] for each in rounds)})
        print(f"{first['world']} ranks  {first['layout']:26} error {summary[-1]['error']:+.0%} over {len(errors)} rounds "
              f"({min(errors):+.0%} to {max(errors):+.0%})")
    errors = [abs(row["error"]) for row in summary]
    print(f"median |error| {statistics.median(errors):.0%}, worst {max(errors):.0%}; within 25%: {sum(e <= 0.25 for e in errors)} of {len(errors)}")
    Path(args.output).write_text(json.dumps({"rows": summary, "rounds": rounds, "torch": torch.__version__, "cores": os.cpu_count(),
                                             "date": time.strftime("%Y-%m-%d")}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
