"""The best layouts of a training run on N GPUs: every layout that divides, planned, ranked.

The candidates: tensor parallelism over 1, 2, 4, ... ranks inside a node (dividing the attention
heads, with sequence parallelism), context parallelism over 2 to 8 ranks for sequences of
:data:`LONG_SEQUENCE` tokens or more (where attention's quadratic work and a sequence's activations
are what a rank runs out of), pipeline stages dividing the layers, data parallelism over the GPUs
left (dividing the global batch), a distributed optimizer (ZeRO-1) or FSDP2 (ZeRO-3, without a
pipeline), and activation recomputation or none; for a mixture of experts, expert parallelism over
each divisor of the data-parallel ranks that divides the experts (with ZeRO-1). Each is planned (:class:`~.plan.Planner`,
whose recordings are made once per tensor parallelism and reused); those that fit come first,
fastest first, then those that do not, by how much they need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..estimates.fake_sharding import ShardingError
from .layout import Layout, LayoutError
from .plan import Planner, TrainingPlan, expert_count, key_value_heads

LONG_SEQUENCE = 8192
"""The sequence from which the search tries context parallelism."""


@dataclass(frozen=True)
class SearchResult:
    plans: tuple[TrainingPlan, ...]
    """Every layout planned, best first."""
    rejected: tuple[str, ...]
    """Each family of layouts not planned, and why (does not divide, crosses a node, cannot be recorded)."""

    @property
    def fitting(self) -> tuple[TrainingPlan, ...]:
        return tuple(plan for plan in self.plans if plan.fits is not False)


def _divisors(value: int) -> list[int]:
    return [candidate for candidate in range(1, value + 1) if value % candidate == 0]


def candidate_layouts(planner: Planner, gpus: int, micro_batch: int = 1) -> tuple[list[Layout], list[str]]:
    """Every layout of ``gpus`` GPUs :func:`best_layouts` plans for ``planner``'s model, and each
    family it leaves out with why."""
    heads = key_value_heads(planner.model)
    layers = planner.recordings.layers
    experts = expert_count(planner.model)
    contexts = [cp for cp in (1, 2, 4, 8) if cp == 1 or (planner.sequence >= LONG_SEQUENCE and planner.sequence % (2 * cp) == 0)]
    layouts, rejected = [], []
    for tp in _divisors(gpus):
        if tp > planner.link.gpus_per_node:
            rejected.append(f"tp {tp}: more than a node's {planner.link.gpus_per_node} GPUs (tensor parallelism stays on NVLink)")
            continue
        if heads is not None and heads % tp:
            rejected.append(f"tp {tp}: does not divide the {heads} key-value heads")
            continue
        for cp in (cp for cp in contexts if (gpus // tp) % cp == 0):
            for pp in _divisors(gpus // (tp * cp)):
                dp = gpus // (tp * cp * pp)
                named = f"tp {tp}" + (f", cp {cp}" if cp > 1 else "") + f", pp {pp}"
                if layers % pp:
                    rejected.append(f"{named}: {pp} stages do not divide the {layers} layers")
                    continue
                if planner.global_batch % (dp * micro_batch):
                    rejected.append(f"{named}: dp {dp} x micro-batch {micro_batch} does not divide the batch of {planner.global_batch}")
                    continue
                for zero in (1, 3) if pp == 1 and dp * cp > 1 else (1,):
                    for ep in [ep for ep in _divisors(dp) if experts % ep == 0] if experts and zero == 1 else [1]:
                        for recompute in ("none", "full"):
                            layouts.append(Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, sequence_parallel=tp > 1, micro_batch=micro_batch, recompute=recompute))
    return layouts, rejected


def best_layouts(planner: Planner, gpus: int, micro_batch: int = 1, tokens: Optional[float] = None) -> SearchResult:
    """Every candidate layout of ``gpus`` GPUs planned: those that fit fastest first (the one that
    needs less memory first where two are as fast), then the rest by their memory per GPU."""
    layouts, rejected = candidate_layouts(planner, gpus, micro_batch)
    plans: list[TrainingPlan] = []
    for layout in layouts:
        try:
            plans.append(planner.plan(layout, tokens))
        except (LayoutError, ShardingError) as error:  # the model has no tensor-parallel plan, say
            rejected.append(f"{layout.describe()}: {error}")
    plans.sort(key=lambda plan: (plan.fits is False, plan.step_s if plan.fits is not False else 0.0, plan.memory_per_gpu_bytes))
    rejected += [f"{plan.layout.describe()}: does not fit ({plan.memory_per_gpu_bytes / 2**30:.1f} GiB per GPU)" for plan in plans if plan.fits is False]
    return SearchResult(tuple(plans), tuple(rejected))
