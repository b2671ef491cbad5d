"""Two processes on the CPU (gloo): profiles gathered across ranks, rank 0 writes."""

from __future__ import annotations

import json
import re
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from jitflops import FlopCountAnalysis, profile_model, write_json
from jitflops.deepspeed_report import format_model_profile
from jitflops.examples import ConvNet


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, folder: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
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


def test_two_ranks_gather_and_rank0_writes(tmp_path):
    mp.spawn(_rank_main, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
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
