"""A parallel layout of a training run, as plain data: how the GPUs split the model and the batch.

Data parallelism (``dp`` replicas; ``zero`` 0 is DDP, 1 shards the optimizer's state, 2 the
gradients too, 3 the parameters: FSDP2), tensor parallelism (``tp`` ranks per layer, with sequence
parallelism or not), pipeline parallelism (``pp`` stages, 1F1B or interleaved over
``virtual_stages`` chunks per rank), context parallelism (``cp``: the sequence split over ranks) and
expert parallelism (``ep``: experts split over ranks, inside the data-parallel ones); micro-batches
of ``micro_batch`` sequences; activation recomputation (none, selective: attention's scores, or
full: each layer's forward again in its backward).
"""

from __future__ import annotations

from dataclasses import dataclass

from .pipeline_order import interleaved_rounds

SCHEDULES = ("1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "full")


class LayoutError(ValueError):
    """A layout that cannot run: the message says which figure does not divide or fit."""


@dataclass(frozen=True)
class Layout:
    """How ``dp x tp x pp x cp`` GPUs split a training run (expert parallelism sits inside ``dp``)."""

    dp: int = 1
    """Data-parallel replicas."""
    tp: int = 1
    """Tensor-parallel ranks per layer, inside a node."""
    pp: int = 1
    """Pipeline stages."""
    cp: int = 1
    ep: int = 1
    zero: int = 1
    """What data parallelism shards: 0 nothing (DDP), 1 the optimizer's state, 2 and the gradients, 3 and the parameters (FSDP2)."""
    sequence_parallel: bool = False
    micro_batch: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    recompute: str = "none"

    def __post_init__(self) -> None:
        problems = [f"{name} must be a positive integer, got {getattr(self, name)!r}" for name in ("dp", "tp", "pp", "cp", "ep", "micro_batch", "virtual_stages")
                    if not isinstance(getattr(self, name), int) or getattr(self, name) < 1]
        if self.zero not in (0, 1, 2, 3):
            problems.append(f"zero must be 0 (DDP), 1, 2 or 3 (FSDP2), got {self.zero!r}")
        if self.schedule not in SCHEDULES:
            problems.append(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.recompute not in RECOMPUTE:
            problems.append(f"recompute must be one of {RECOMPUTE}, got {self.recompute!r}")
        if self.schedule == "1f1b" and self.virtual_stages != 1:
            problems.append("virtual stages need the interleaved schedule")
        if self.sequence_parallel and self.tp == 1:
            problems.append("sequence parallelism splits what tensor parallelism leaves whole: it needs tp > 1")
        if isinstance(self.dp, int) and isinstance(self.ep, int) and self.ep > 1 and self.dp % self.ep:
            problems.append(f"expert parallelism runs inside the data-parallel ranks: ep {self.ep} must divide dp {self.dp}")
        if problems:
            raise LayoutError("; ".join(problems))

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def micro_batches(self, global_batch: int) -> int:
        """Micro-batches each data-parallel replica runs per step (gradient accumulation, or the pipeline's)."""
        per_replica, left = divmod(global_batch, self.dp * self.micro_batch)
        if left or not per_replica:
            raise LayoutError(f"the global batch of {global_batch} sequences does not divide into {self.dp} replicas of {self.micro_batch}-sequence micro-batches")
        rounds = interleaved_rounds(self.pp, per_replica)
        if self.virtual_stages > 1 and per_replica % rounds:
            raise LayoutError(f"the interleaved schedule runs {per_replica} micro-batches in {rounds} rounds of pp {self.pp}: give a multiple of {rounds}")
        return per_replica

    def describe(self) -> str:
        parts = [f"tp {self.tp}" + (" (sp)" if self.sequence_parallel else ""), f"pp {self.pp}" + (f" x{self.virtual_stages}" if self.virtual_stages > 1 else ""),
                 f"dp {self.dp}" + (f" zero-{self.zero}" if self.zero else " ddp")]
        parts += [f"cp {self.cp}"] * (self.cp > 1) + [f"ep {self.ep}"] * (self.ep > 1)
        return ", ".join(parts) + f"; micro-batch {self.micro_batch}, recompute {self.recompute}"
