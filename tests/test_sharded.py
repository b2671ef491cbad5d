"""Sharded training, 2 and 4 gloo processes on the CPU: each rank counts its own work, collectives
are counted as torch's ``CommDebugMode`` sees them, with hand-computed bytes, and the model's
sharding is left as it was (each rank's code: ``tests/sharded_cases.py``)."""

from __future__ import annotations

import json
import os
import re

import pytest

from helpers import run_on_ranks
from sharded_cases import BATCH, D_HIDDEN, D_IN, run_rank
from test_distributed import _free_port, process_group_file

FLOAT = 4  # bytes
MLP_MACS = BATCH * (D_IN * D_HIDDEN + D_HIDDEN * D_IN)


def spawn(case: str, world: int, folder, fresh: bool = False) -> list[dict]:
    run_on_ranks(run_rank, world, world, process_group_file(str(folder)), str(folder), case, fresh=fresh)
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(world)]


def all_reduce_bus(bytes_: int, n: int) -> float:
    return bytes_ * 2 * (n - 1) / n


@pytest.mark.parametrize("world", [2])  # 4 ranks: the FSDP x TP Llama example below, and the plan's collectives (test_plan.py)
def test_tensor_parallel_ranks_count_their_shards(tmp_path, world):
    ranks = spawn("tensor_parallel", world, tmp_path)
    for rank in ranks:
        mlp = rank["mlp"]
        assert mlp["counted_by"] == "dispatch" and mlp["unsupported"] == [] and mlp["state_kept"]
        assert mlp["forward"] == MLP_MACS // world  # a Colwise and a Rowwise Linear: 1/n of each on each rank
        # backward: input and weight gradients of both Linears (x requires grad), each a 1/n shard
        assert mlp["phases"] == {"forward": MLP_MACS // world, "backward": 2 * MLP_MACS // world}
        # Rowwise's output is all-reduced in the forward, Colwise's input gradient in the backward
        assert mlp["collectives"] == {
            "all_reduce": [1, BATCH * D_IN * FLOAT, all_reduce_bus(BATCH * D_IN * FLOAT, world), [world]],
            "backward.all_reduce": [1, BATCH * D_IN * FLOAT, all_reduce_bus(BATCH * D_IN * FLOAT, world), [world]],
        }
        assert mlp["comm_debug"] == {"all_reduce": 2}
        # each collective in the module CommDebugMode puts it in: the Rowwise Linear's output hook, not its parent
        assert mlp["comm_modules"] == mlp["comm_debug_modules"] == ["", "0", "2"]
        # Colwise's output is a shard; Rowwise's partial sums are whole on every rank before the all-reduce
        assert mlp["activations"] == BATCH * D_HIDDEN // world + BATCH * D_IN
        assert mlp["get_model_profile_macs"] == MLP_MACS // world  # DeepSpeed's per-GPU figure
        # the all-reduce is a row of the op table with its time, and so are the wait and, where torch
        # hands the result over to autograd (2.13; 2.14 does not), the hand-over
        timed = [op for op, _ in mlp["timed_collectives"]]
        assert timed[0] == "_c10d_functional::all_reduce" and timed[-1] == "_c10d_functional::wait_tensor"
        assert timed[1:-1] in ([], ["_c10d_functional::_wrap_tensor_autograd"])
        assert mlp["timed_collectives"][0][1]
        profile = mlp["profile"]
        assert profile["gathered_macs"] == MLP_MACS and profile["ranks"] == world  # the cluster: the unsharded count
        assert profile["parallel"] == [world, 1, world]  # model parallel over the whole (unnamed, 1-D) mesh
        assert [c["collective"] for c in profile["collectives"]] == ["all_reduce"] and profile["collectives"][0]["bytes"] == BATCH * D_IN * FLOAT
        assert re.search(rf"^comm per GPU: all_reduce: +1 calls, 2\.05 KB, bus [\d.]+ KB, group size {world}$", profile["text"], re.M)
        assert re.search(rf"^model parallel size: +{world}$", profile["text"], re.M)
        assert re.search(r"^cluster MFU = .*: +[\d.]+%$", profile["text"], re.M)
        assert profile["json"]["collectives"][0]["calls"] == 1 and profile["json"]["slowest_rank"] in range(world)
    if world == 2:
        _holds_norm_redundancy(ranks, world)


def _holds_norm_redundancy(ranks: list[dict], world: int) -> None:
    """A LayerNorm without sequence parallelism runs whole on every rank: the cluster counts it
    ``world`` times. Under sequence parallelism each rank normalises its tokens only."""
    unsharded, norm = ranks[0]["unsharded_norm_mlp"], ranks[0]["unsharded_norm"]
    assert norm > 0
    replicated = sum(rank["replicated_norm"]["forward"] for rank in ranks)
    assert replicated == unsharded + (world - 1) * norm
    sequence = [rank["sequence_parallel"] for rank in ranks]
    assert sum(rank["forward"] for rank in sequence) == ranks[0]["unsharded_sequence"]
    tokens_bytes = 2 * BATCH * world * D_IN * FLOAT  # the whole sequence: (2, 8 x world, 64)
    for rank in sequence:
        assert rank["unsupported"] == []
        # the sharded tokens are gathered before the Colwise Linear, the Rowwise output reduce-scattered
        assert rank["collectives"]["all_gather"][:2] == [1, tokens_bytes]
        assert rank["collectives"]["reduce_scatter"][:2] == [1, tokens_bytes]
        assert rank["collectives"]["all_gather"][2] == tokens_bytes * (world - 1) / world
        assert rank["comm_debug"] == {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2}


@pytest.mark.parametrize("world", [2])
def test_reading_a_count_on_rank_0_runs_no_collective(tmp_path, world):
    """``if rank == 0: print(flops.total())`` before the next all_reduce: the forward's all_reduce ran
    when the analyses were made, on every rank (gloo aborted the job with 'Received data size
    doesn't match expected size' when the read ran it on rank 0 alone)."""
    ranks = spawn("read_on_rank_0", world, tmp_path)
    for rank, figures in enumerate(ranks):
        assert figures["collectives_when_made"] == 2  # one forward per analysis, each with its Rowwise all_reduce
        assert figures["step_all_reduce"] == [world * (world + 1) / 2] * (3 * world + 1)
        assert figures["total_after"] == MLP_MACS // world
    assert ranks[0]["collectives_when_read"] == 0 and ranks[0]["total"] == MLP_MACS // world
    assert ranks[0]["activations"] == BATCH * D_HIDDEN // world + BATCH * D_IN
    model_row = ranks[0]["table"].splitlines()[2].split("|")
    assert model_row[1].strip() == "model" and model_row[3].strip() == {2: "0.131M", 4: "65.536K"}[world]  # MLP_MACS // world


def test_fsdp2_and_ddp_ranks_count_their_batches_and_communication(tmp_path):
    world = 2
    for rank in spawn("data_parallel", world, tmp_path):
        fsdp = rank["fsdp2"]
        assert fsdp["counted_by"] == "dispatch" and fsdp["unsupported"] == [] and fsdp["state_kept"]
        assert fsdp["forward"] == MLP_MACS  # every rank runs the whole model on its own batch
        assert fsdp["phases"]["backward"] == 2 * MLP_MACS - BATCH * D_IN * D_HIDDEN  # no gradient for the input
        first, second = (D_IN * D_HIDDEN + D_HIDDEN) * FLOAT, (D_HIDDEN * D_IN + D_IN) * FLOAT  # each Linear's flat parameters
        assert fsdp["collectives"]["all_gather"][:2] == [2, first + second]  # gathered for the forward,
        assert fsdp["collectives"]["backward.all_gather"][:2] == [2, first + second]  # again for the backward,
        assert fsdp["collectives"]["backward.reduce_scatter"][:2] == [2, first + second]  # gradients reduce-scattered
        assert fsdp["comm_debug"] == {"_allgather_base_": 4, "_reduce_scatter_base_": 2}
        assert fsdp["parallel"] == [world, world, 1]
        ddp = rank["ddp"]
        assert ddp["counted_by"] == "jit" and ddp["forward"] == MLP_MACS
        # one bucket: every gradient all-reduced once in the backward
        assert ddp["collectives"]["backward.all_reduce"][:2] == [1, (first + second)]
        assert ddp["comm_debug"] == {"allreduce_": 1}


def test_expert_parallel_all_to_all(tmp_path):
    world = 2
    for rank in spawn("expert_parallel", world, tmp_path):
        moe = rank["moe"]
        # each rank's two experts see the 8 tokens sent to them, 4 each: 8 x 16 x 32 MACs
        assert moe["forward"] == BATCH * 16 * 32 and moe["unsupported"] == []
        assert moe["collectives"]["all_to_all"] == [2, BATCH * 16 * FLOAT + BATCH * 32 * FLOAT, (BATCH * 16 + BATCH * 32) * FLOAT / 2, [2]]
        assert moe["collectives"]["backward.all_to_all"][:2] == [2, BATCH * 16 * FLOAT + BATCH * 32 * FLOAT]
        assert moe["comm_debug"] == {"all_to_all_single": 4}


def test_pipeline_stages_count_their_layers_per_micro_batch(tmp_path):
    ranks = spawn("pipeline", 2, tmp_path)
    activation = 4 * 32 * FLOAT  # one micro-batch's activation, or its gradient
    for rank in ranks:
        assert rank["forwards"] == 2  # one forward per micro-batch
        assert rank["macs"] == 2 * 4 * (32 * 64 + 64 * 32)
    assert ranks[0]["collectives"] == {"send": [2, 2 * activation, True], "recv": [2, 2 * activation, True]}
    assert ranks[1]["collectives"] == {"recv": [2, 2 * activation, True], "send": [2, 2 * activation, True]}


def test_a_failing_or_absent_rank_is_named_on_the_others(tmp_path, monkeypatch):
    monkeypatch.setenv("JITFLOPS_RANK_TIMEOUT_S", "3")  # read as jitflops is imported: in fresh processes
    ranks = spawn("faults", 2, tmp_path, fresh=True)
    assert "rank 1 failed while profiling: TraceError" in ranks[0]["raises"] and "mat1 and mat2 shapes" in ranks[0]["raises"]
    assert ranks[1]["raises"].startswith("TraceError")  # its own error
    assert "not every rank came to jitflops' profile gather within 3 s" in ranks[0]["absent"] and "1" in ranks[0]["absent"]
    assert ranks[0]["state_kept"] and ranks[1]["state_kept"]


def test_the_fsdp_by_tensor_parallel_llama_example_on_4_processes(tmp_path):
    """The README's example: per-rank counts equal the hand count; the cluster's sum equals the
    unsharded model on the whole batch plus the work tensor parallelism repeats on each of its
    ranks (the norms and the output layer, which run whole)."""
    import subprocess
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
    import sharded_llama as example
    from jitflops import FlopCountAnalysis

    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
         "examples/sharded_llama.py", "--json", str(tmp_path / "llama.json")],
        cwd=Path(__file__).parents[1], capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads((tmp_path / "llama.json").read_text())
    per_rank = example.hand_count_per_rank(tensor_parallel=2)
    assert [rank["summary"]["macs"] for rank in document["ranks"]] == [per_rank] * 4
    summary = document["ranks"][0]["summary"]
    assert [summary["world_size"], summary["data_parallel_size"], summary["model_parallel_size"]] == [4, 2, 2]  # from the ("dp", "tp") mesh
    torch.manual_seed(0)
    unsharded = example.Llama()
    tokens = torch.randint(0, example.VOCAB, (2 * example.BATCH, example.SEQ))  # both data-parallel ranks' batches
    whole = FlopCountAnalysis(unsharded, tokens)
    repeated = sum(whole.total(name) for name in ("norm", "output", *(f"layers.{i}.{norm}" for i in range(example.LAYERS) for norm in ("attention_norm", "ffn_norm"))))
    assert document["modules"][0]["macs"] == whole.total() + (2 - 1) * repeated  # tensor-parallel size 2: once more
    collectives = {c["collective"]: c for c in summary["collectives"]}
    assert set(collectives) == {"all_gather", "all_reduce", "backward.all_gather", "backward.all_reduce", "backward.reduce_scatter"}
    assert collectives["all_reduce"]["calls"] == 2 * example.LAYERS  # each block's two Rowwise outputs
    assert collectives["all_reduce"]["bytes"] == 2 * example.LAYERS * example.BATCH * example.SEQ * example.DIM * FLOAT
    assert collectives["all_gather"]["calls"] == example.LAYERS + 1  # each block's parameters, and the root's
    assert "comm per GPU: backward.reduce_scatter" in result.stdout and "cluster MFU" in result.stdout
    assert f"hand count of one rank's forward MACs: {per_rank:,}" in result.stdout


LIGHTNING_DDP = '''
import json, os, sys, warnings
import torch
import torch.distributed as dist
from torch import nn
import pytorch_lightning as pl
from jitflops.integrations.lightning import FlopsCallback

warnings.simplefilter("ignore")


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        return self.mlp(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


data = torch.utils.data.TensorDataset(torch.randn(64, 32), torch.randint(0, 4, (64,)))
profiles = []
callback = FlopsCallback(peak_flops=1e11, schedule=torch.profiler.schedule(wait=2, warmup=0, active=1, repeat=1), on_ready=profiles.append)
trainer = pl.Trainer(max_steps=6, log_every_n_steps=3, logger=pl.loggers.CSVLogger(sys.argv[1], name="run"), callbacks=[callback],
                     accelerator="cpu", devices=2, strategy="ddp", enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=8))
profile = profiles[0]
with open(f"{sys.argv[1]}/rank{trainer.global_rank}.json", "w") as stream:
    json.dump({"macs": profile.summary.macs, "backward_macs": profile.summary.backward_macs, "gathered": profile.root.macs,
               "ranks": len(profile.ranks), "world": profile.summary.parallel.world}, stream)
dist.barrier()  # both ranks' figures are written
dist.destroy_process_group()
os._exit(0)  # without C++ static destructors, where gloo sometimes aborts a process at exit (as in the Trainer's script)
'''


def test_lightning_ddp_profiles_every_rank(tmp_path):
    """Lightning's DDP strategy on 2 CPU processes: its forward redirection runs training_step
    through the module's call; the callback counts the forward inside it, on every rank."""
    import subprocess
    import sys

    pytest.importorskip("pytorch_lightning")
    script = tmp_path / "train.py"
    script.write_text(LIGHTNING_DDP)
    result = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "MASTER_PORT": str(_free_port())})
    assert result.returncode == 0, result.stderr[-3000:]
    forward = 8 * (32 * 64 + 64 * 4)  # a batch of 8 on each rank
    for rank in range(2):
        figures = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert figures == {"macs": forward, "backward_macs": 8 * (64 * 4 * 2 + 32 * 64), "gathered": 2 * forward, "ranks": 2, "world": 2}
    rows = (tmp_path / "run" / "version_0" / "metrics.csv").read_text().splitlines()
    logged = [row for row in rows[1:] if row.split(",")[1]]
    assert [float(row.split(",")[1]) for row in logged] == [2 * (forward + 8 * (64 * 4 * 2 + 32 * 64))] * 2  # flops_per_step


TRAINER_DDP = '''
import json, os, sys, warnings
import torch
import torch.distributed as dist
from torch import nn
import transformers
from jitflops.integrations.transformers import FlopsCallback

warnings.simplefilter("ignore")


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, inputs, labels):
        logits = self.net(inputs)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


dataset = [{"inputs": torch.randn(32), "labels": torch.tensor(i % 4)} for i in range(64)]
args = transformers.TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=8, max_steps=6, logging_steps=3, report_to="none",
                                      use_cpu=True, save_strategy="no", disable_tqdm=True, ddp_backend="gloo")
trainer = transformers.Trainer(model=Mlp(), args=args, train_dataset=dataset)
profiles = []
FlopsCallback(peak_flops=1e11, schedule=torch.profiler.schedule(wait=1, warmup=0, active=1, repeat=1), on_ready=profiles.append).attach(trainer)
trainer.train()
profile = profiles[0]
with open(f"{sys.argv[1]}/rank{dist.get_rank()}.json", "w") as stream:
    json.dump({"macs": profile.summary.macs, "backward_macs": profile.summary.backward_macs, "gathered": profile.root.macs,
               "ranks": len(profile.ranks), "logged": [entry["flops_per_step"] for entry in trainer.state.log_history if "flops_per_step" in entry]}, stream)
dist.barrier()
dist.destroy_process_group()
os._exit(0)  # without C++ static destructors, where gloo sometimes aborts a process at exit (as in sharded_cases.py)
'''


def test_transformers_trainer_ddp_profiles_every_rank(tmp_path):
    """transformers' Trainer under torchrun on 2 CPU processes (DDP over gloo), with the callback."""
    import subprocess
    import sys

    pytest.importorskip("transformers")
    script = tmp_path / "train.py"
    script.write_text(TRAINER_DDP)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script), str(tmp_path)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    forward, backward = 8 * (32 * 64 + 64 * 4), 8 * (64 * 4 * 2 + 32 * 64)
    for rank in range(2):
        figures = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert figures == {"macs": forward, "backward_macs": backward, "gathered": 2 * forward, "ranks": 2, "logged": [2 * (forward + backward)] * 2}
