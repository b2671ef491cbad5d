"""A small Llama-shaped model, sharded FSDP2 x tensor parallel (2 x 2) on 4 CPU processes, trained
for a few steps under jitflops' ``FlopsProfiler``: per-rank and cluster profiles with communication.

    torchrun --nproc_per_node 4 examples/sharded_llama.py

Every rank counts its own work (half of each tensor-parallel Linear's MACs on its batch, the
attention products of its heads, and the norms and output layer it runs whole) and the collectives it runs: FSDP2's all-gathers
and reduce-scatters over the data-parallel dimension, tensor parallelism's all-reduces over the
other. Rank 0 prints the profile of the profiled step (figures per GPU, the slowest rank, the
cluster's MFU) and a table of every rank's figures. ``--json FILE`` also writes the gathered
profile (every rank's inside).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from jitflops import FlopsProfiler, ModelProfile, write_json
from jitflops.profiling.ranks import is_writer

VOCAB, DIM, LAYERS, HEADS, KV_HEADS, HIDDEN, SEQ, BATCH = 512, 128, 2, 8, 4, 256, 64, 4
"""The model and the data: each data-parallel rank trains on BATCH sequences of SEQ tokens."""


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq = nn.Linear(DIM, HEADS * self.head_dim, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wo = nn.Linear(HEADS * self.head_dim, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds its share of the heads
        q = self.wq(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(DIM)
        self.feed_forward = FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


TP_PLAN = {
    "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
    "attention.wo": RowwiseParallel(),
    "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(),
}
"""torchtitan's plan for a block, without sequence parallelism: the norms run whole on every
tensor-parallel rank (the redundancy the cluster total states)."""


def sharded_llama(data_parallel: int, tensor_parallel: int) -> nn.Module:
    """The model, tensor-parallel inside each block over mesh["tp"], then FSDP2 over mesh["dp"]."""
    mesh = init_device_mesh("cpu", (data_parallel, tensor_parallel), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = Llama()
    for block in model.layers:
        parallelize_module(block, mesh["tp"], TP_PLAN)
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def hand_count_per_rank(tensor_parallel: int) -> int:
    """The forward MACs of one rank, by hand: its share of each tensor-parallel Linear, the
    attention products of its heads (SDPA's dense convention), and, whole on every rank, the
    RMS norms (4 per element) and the output layer."""
    tokens = BATCH * SEQ
    head_dim = DIM // HEADS
    linears = DIM * (HEADS + 2 * KV_HEADS) * head_dim + HEADS * head_dim * DIM + 3 * DIM * HIDDEN
    attention = 2 * BATCH * (HEADS // tensor_parallel) * SEQ * SEQ * head_dim  # q @ k^T and scores @ v
    norms = (2 * LAYERS + 1) * tokens * DIM * 4
    return LAYERS * (tokens * linears // tensor_parallel + attention) + norms + tokens * DIM * VOCAB


def rank_table(profile: ModelProfile) -> str:
    lines = [f"{'rank':>4} {'fwd MACs':>14} {'bwd MACs':>14} {'comm bytes':>12} {'fwd+bwd s':>10}"]
    for index, rank in enumerate(profile.ranks):
        summary = rank.summary
        work = summary.measured_work
        lines.append(f"{index:>4} {summary.macs:>14,} {summary.backward_macs or 0:>14,} {summary.comm_bytes:>12,} {work[1] if work else float('nan'):>10.4f}")
    total = sum(rank.summary.macs for rank in profile.ranks)
    lines.append(f"cluster forward MACs (sum over ranks): {total:,}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="training steps; the last one is profiled")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size (the data-parallel size is the rest)")
    parser.add_argument("--json", help="write the gathered profile here")
    parser.add_argument("--no-profile", action="store_true", help="train without the profiler (tools/bench.py's baseline)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    try:
        world = dist.get_world_size()
        model = sharded_llama(world // args.tp, args.tp)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        generator = torch.Generator().manual_seed(dist.get_rank())
        profiler = None if args.no_profile else FlopsProfiler(model, peak_flops=float(os.environ.get("PEAK_FLOPS", 1e11)))
        started = 0.0
        step_seconds: list[float] = []
        profile = None
        for step in range(args.steps):
            if step == 1:  # the first step builds FSDP's buffers: the steps after it are timed
                dist.barrier()
                started = time.perf_counter()
            began = time.perf_counter()
            tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator)
            profiled = profiler is not None and step == args.steps - 1
            if profiled:
                profiler.start_profile()
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if profiled:
                profiler.print_model_profile(profile_step=step, module_depth=2)
                profile = profiler.profile(step)
                profiler.end_profile()
            step_seconds.append(time.perf_counter() - began)
        if profile is not None:
            if is_writer():
                print(rank_table(profile))
                print(f"hand count of one rank's forward MACs: {hand_count_per_rank(args.tp):,}; loss {loss.item():.3f} (ln {VOCAB} = {math.log(VOCAB):.3f})")
            if args.json:
                write_json(profile, args.json)
        dist.barrier()
        if is_writer():
            print(f"seconds for steps 1 to {args.steps - 1}: {time.perf_counter() - started:.4f}")
            unprofiled = statistics.median(step_seconds[1:-1] if profile is not None else step_seconds[1:])
            last = f", the profiled step (with its printouts) {step_seconds[-1]:.4f}" if profile is not None else ""
            print(f"step seconds: unprofiled {unprofiled:.4f} (median){last}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
