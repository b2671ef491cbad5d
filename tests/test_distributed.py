"""Two processes on the CPU (gloo): profiles gathered across ranks, rank 0 writes."""

from __future__ import annotations

import json
import re
import socket
import uuid

import torch
import torch.distributed as dist
import pytest

from jitflops import FlopCountAnalysis, profile_model, write_json
from jitflops.reports.deepspeed_report import format_model_profile
from jitflops.examples import ConvNet

from helpers import run_on_ranks


def _free_port() -> int:
    """A port free now, for Lightning's DDP subprocess (``MASTER_PORT``; another process may take it
    before the subprocess binds it: ranks spawned here meet in a file, :func:`process_group_file`,
    and ``torchrun`` runs ``--standalone``, its rendezvous on a port it binds itself)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def process_group_file(folder: str) -> str:
    """An ``init_method`` for ranks spawned by a test: a file of its own in ``folder`` (a port probed
    free could be taken by another test's gloo connections before rank 0 binds it)."""
    return f"file://{folder}/{uuid.uuid4().hex}.store"


def _rank_main(rank: int, world: int, store: str, folder: str) -> None:
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = ConvNet().eval()
        x = torch.randn(rank + 1, 3, 16, 16)  # each rank its own batch: rank r sees r + 1 images
        profile = profile_model(model, x, repeats=2)
        write_json(profile, f"{folder}/profile.json")  # only rank 0 writes
        local = FlopCountAnalysis(model, x).total()
        figures = {
            "local_macs": local,
            "gathered_macs": profile.root.macs,
            "latency_samples": len(profile.root.latency.samples),
            "summary": [profile.summary.parallel.world, profile.summary.parallel.data_parallel],
            "text": format_model_profile(profile, module_depth=0),
        }
        with open(f"{folder}/rank{rank}.json", "w") as stream:
            json.dump(figures, stream)
    finally:
        dist.destroy_process_group()


def test_two_ranks_gather_and_rank0_writes(tmp_path, tmp_path_factory):
    store = process_group_file(str(tmp_path_factory.mktemp("store")))  # apart from the ranks' files: gloo may leave it behind a moment
    run_on_ranks(_rank_main, 2, 2, store, str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    per_image = ranks[0]["local_macs"]
    assert ranks[1]["local_macs"] == 2 * per_image
    assert ranks[0]["gathered_macs"] == ranks[1]["gathered_macs"] == 3 * per_image  # summed over ranks
    assert all(r["latency_samples"] == 2 for r in ranks)  # one median per rank
    assert ranks[0]["summary"] == [2, 2]
    assert re.search(r"^world size: +2$", ranks[0]["text"], re.M) and re.search(r"^data parallel size: +2$", ranks[0]["text"], re.M)
    document = json.loads((tmp_path / "profile.json").read_text())
    assert len(document["ranks"]) == 2 and document["modules"][0]["macs"] == 3 * per_image
    assert [rank["summary"]["batch_size"] for rank in document["ranks"]] == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.json", "rank0.json", "rank1.json"]


def _sharded_rank_main(rank: int, world: int, store: str, folder: str, engine: str) -> None:
    """The issue's MLP, sharded by ``engine``, counted by the default call (the JIT's fallback)."""
    import warnings

    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh

    from jitflops import JitFallbackWarning

    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
        if engine == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            for layer in (model[0], model[2]):
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        else:
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            analysis = FlopCountAnalysis(model, torch.randn(8, 64)).unsupported_ops_warnings(False)
            total = analysis.total()
        figures = {
            "total": total,
            "counted_by": analysis.counted_by,
            "warnings": [str(w.message) for w in caught if issubclass(w.category, JitFallbackWarning)],
            "unsupported": sorted(analysis.unsupported_ops()),
        }
        with open(f"{folder}/rank{rank}.json", "w") as stream:
            json.dump(figures, stream)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("engine", ["fsdp2", "tensor_parallel"])
def test_sharded_models_are_counted_by_the_default_call(tmp_path, engine):
    run_on_ranks(_sharded_rank_main, 2, 2, process_group_file(str(tmp_path)), str(tmp_path), engine)
    for rank in range(2):
        figures = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert figures["counted_by"] == "dispatch" and len(figures["warnings"]) == 1
        assert ("FSDP2" if engine == "fsdp2" else "DTensor parameters") in figures["warnings"][0]
        # the collectives themselves are what is left (their communication is the sharded-training work)
        assert all(op.startswith(("c10d::", "_c10d_functional::")) for op in figures["unsupported"]), figures["unsupported"]
        if engine == "fsdp2":
            assert figures["total"] == 8 * (64 * 256 + 256 * 64)  # every rank runs the whole MLP on its batch
