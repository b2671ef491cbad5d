"""``jitflops calibrate --collectives N``: this machine's collectives, measured as nccl-tests measures
a fabric, as an interconnect a plan reads.

N processes on the loopback (gloo, each on ``cores // N`` threads, as the ranks of a run of N
would be) time an all-reduce, an all-gather and a reduce-scatter of each size from 64 KiB to
16 MiB: each size's median of its repeats after a warm-up, every rank waiting at a barrier before
each call, the slowest rank's time kept (a collective ends when its last rank does). A collective of
``b`` bytes on ``n`` ranks is modelled as :mod:`.collective_time` prices it, ``steps(n) x latency +
bus bytes / bus bandwidth`` (nccl-tests' bus bytes), with figures per collective (gloo runs each
by an algorithm of its own); each pair is the least-squares fit of that collective's
measurements, weighted by their inverse so that small and large sizes count alike. They become
an interconnect (:func:`~.interconnects.interconnect` reads the file) whose one node holds the N ranks, its efficiency 1 (the
bandwidth is what the collectives reached, not a datasheet's). The file keeps every measurement
beside the fit, and the fit's error on each.

A step calls its collectives right after compute, not after a barrier, and each blocks: on a VM
whose idle vCPUs halt, the rank that waits is woken late (an all-reduce of 512 KiB on 2 ranks took
1.1 ms after a barrier that followed the ranks' products, 4.0-4.4 ms right after them). So each
rank also times an all-reduce of 64 KiB right after :data:`WAIT_PRODUCTS` products of its own, and
again with a barrier between: the difference of their medians (the slowest rank's, at least 0) is
``blocked_wait_s``, which every collective's time adds.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import torch

from .collective_time import ring_terms

SIZES = tuple(2**power for power in range(16, 25, 2))
"""Bytes per call: 64 KiB, 256 KiB, 1 MiB, 4 MiB, 16 MiB (an all-gather's output, a reduce-scatter's input)."""

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")

WAIT_PRODUCTS = 8
"""Products of two 256 x 256 matrices before each timed call of the blocked wait (about 4 ms on one core)."""


def free_port() -> int:
    """A TCP port of the loopback no process listens on now, for a process group's rendezvous."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _call(name: str, buffer: torch.Tensor, output: torch.Tensor) -> None:
    import torch.distributed as dist

    if name == "all_reduce":
        dist.all_reduce(buffer)
    elif name == "all_gather":
        dist.all_gather_into_tensor(output, buffer)
    else:
        dist.reduce_scatter_tensor(buffer, output)


def _rank(rank: int, world: int, port: int, folder: str, repeats: int, threads: int) -> None:
    """One rank: each collective at each size, its slowest rank's median time, written by rank 0."""
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        measured: list[dict[str, Any]] = []
        for name in COLLECTIVES:
            for size in SIZES:
                elements = size // 4
                shard = elements // world
                # an all-gather gathers shards into the size; a reduce-scatter scatters the size into shards
                buffer = torch.ones(elements if name != "all_gather" else shard)
                output = torch.empty(shard if name == "reduce_scatter" else elements) if name != "all_reduce" else buffer
                if name == "reduce_scatter":
                    buffer, output = output, buffer  # reduce_scatter_tensor(output shard, input whole)
                times = []
                for repeat in range(repeats + 1):
                    dist.barrier()
                    started = time.perf_counter()
                    _call(name, buffer, output)
                    if repeat:  # the first call is the warm-up
                        times.append(time.perf_counter() - started)
                slowest = torch.tensor([statistics.median(times)], dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                measured.append({"collective": name, "bytes": size, "seconds": slowest.item()})
        wait = torch.tensor([_blocked_wait(repeats)], dtype=torch.float64)
        dist.all_reduce(wait, op=dist.ReduceOp.MAX)
        if rank == 0:
            Path(folder, "measured.json").write_text(json.dumps(measured + [{"collective": "blocked_wait", "seconds": wait.item()}]))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _blocked_wait(repeats: int) -> float:
    """The median of an all-reduce's time right after compute, less its median with a barrier
    between the compute and the call (at least 0)."""
    import torch.distributed as dist

    left, right, buffer = torch.randn(256, 256), torch.randn(256, 256), torch.ones(2**14)
    medians = []
    for synced in (False, True):
        times = []
        for _ in range(repeats + 1):
            dist.barrier()
            for _ in range(WAIT_PRODUCTS):
                left @ right
            if synced:
                dist.barrier()
            started = time.perf_counter()
            dist.all_reduce(buffer)
            times.append(time.perf_counter() - started)
        medians.append(statistics.median(times[1:]))
    return max(0.0, medians[0] - medians[1])


def measure_collectives(world: int, repeats: int = 10) -> list[dict[str, Any]]:
    """Each collective's time at each size on ``world`` gloo processes of this machine (their slowest's median)."""
    import torch.multiprocessing as mp

    if world < 2:
        raise ValueError(f"collectives need at least 2 ranks, got {world}")
    threads = max(1, (os.cpu_count() or 1) // world)
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_rank, args=(world, free_port(), folder, repeats, threads), nprocs=world, join=True)
        return json.loads(Path(folder, "measured.json").read_text())


def _terms(point: dict[str, Any], world: int) -> tuple[int, float]:
    """A measurement's two regressors: the ring's steps and the bus bytes."""
    return ring_terms(point["collective"], world, point["bytes"])


def fit_link(measured: list[dict[str, Any]], world: int) -> dict[str, dict[str, float]]:
    """Each collective's latency per ring step (seconds) and bus bandwidth (bytes per second): the
    least squares of its measurements' relative errors, the latency kept non-negative. Each
    collective has figures of its own, as nccl-tests reports a bus bandwidth per collective: a
    backend runs each by its own algorithm (gloo's all-reduce of a small buffer takes several times
    its all-gather's time, and its reduce-scatter reduces the whole buffer, as an all-reduce does)."""
    fitted = {}
    for name in sorted({point["collective"] for point in measured}):
        points = [point for point in measured if point["collective"] == name]
        rows = [[terms[0] / point["seconds"], terms[1] / point["seconds"]] for point in points for terms in [_terms(point, world)]]
        matrix, target = torch.tensor(rows, dtype=torch.float64), torch.ones(len(rows), 1, dtype=torch.float64)
        latency, inverse = torch.linalg.lstsq(matrix, target).solution.squeeze(1).tolist()
        if latency < 0:  # the bandwidth alone
            latency, inverse = 0.0, torch.linalg.lstsq(matrix[:, 1:], target).solution.item()
        if inverse <= 0:
            raise ValueError(f"the {name} times do not grow with their bytes: no bandwidth can be fitted")
        fitted[name] = {"latency_s": latency, "bus_bandwidth": 1 / inverse}
    return fitted


def calibrate_collectives(world: int, repeats: int = 10, measured: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
    """The interconnect of ``world`` gloo ranks on this machine, as a document: the fitted link, and
    each measurement with the fit's time and error."""
    measured = measured if measured is not None else measure_collectives(world, repeats)
    wait = next((point["seconds"] for point in measured if point["collective"] == "blocked_wait"), 0.0)
    measured = [point for point in measured if point["collective"] != "blocked_wait"]
    fitted = fit_link(measured, world)
    for point in measured:
        steps, bus = _terms(point, world)
        figures = fitted[point["collective"]]
        point["fitted_seconds"] = steps * figures["latency_s"] + bus / figures["bus_bandwidth"]
        point["error"] = point["fitted_seconds"] / point["seconds"] - 1
    bandwidth, latency = fitted["all_reduce"]["bus_bandwidth"], fitted["all_reduce"]["latency_s"]
    link = {"name": f"gloo-loopback-{world}", "gpus_per_node": world, "intra_node_bandwidth": bandwidth, "inter_node_bandwidth": bandwidth,
            "intra_node_latency_s": latency, "inter_node_latency_s": latency, "efficiency": 1.0, "inter_node_efficiency": 1.0,
            "measured_collectives": fitted, "blocked_wait_s": wait,
            "source": f"measured by jitflops calibrate --collectives {world} on {socket.gethostname()}, {time.strftime('%Y-%m-%d')}: gloo over the "
                      f"loopback, {len(measured)} calls of 64 KiB to 16 MiB, each collective fitted as steps x latency + bus bytes / bandwidth"}
    return {"interconnect": link, "measured": measured, "blocked_wait_s": wait}

