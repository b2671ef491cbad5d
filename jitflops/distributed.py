"""Profiles of multi-process runs: gathered across ranks, printed and written by rank 0.

When ``torch.distributed`` is initialised, every rank profiles its own share of the work; then
:func:`gather_profile` combines them on every rank:

* counts (MACs per op, elementwise FLOPs, activations) are summed over the ranks;
* a module's latency becomes the ranks' median latencies, one sample per rank, so its ``max`` is
  the slowest rank and its ``mean`` the mean over ranks (the JSON export has both);
* parameters stay per rank (DeepSpeed's "params per GPU"), as does the summary;
* each rank's own profile stays available in ``ModelProfile.ranks`` (without its analyses).

Only rank 0 prints profiles and writes files. Gathering is a collective call: every rank must ask
for the same profiles (``profile_model``, ``FlopsProfiler.profile``/``print_model_profile``/
``get_total_*``), as with any ``torch.distributed`` collective.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch.distributed as dist

from .hierarchy import combined_trees
from .model_profile import ModelProfile
from .timing import LatencyStats


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def is_writer() -> bool:
    """Whether this process prints and writes: rank 0, or the only process."""
    return not is_distributed() or dist.get_rank() == 0


def _one_sample_per_rank(name: str, latencies: list[Optional[LatencyStats]]) -> Optional[LatencyStats]:
    return LatencyStats(tuple(stats.median for stats in latencies if stats is not None)) if latencies and None not in latencies else None


def gather_profile(profile: ModelProfile) -> ModelProfile:
    """The profile of all ranks together (unchanged in one process)."""
    if not is_distributed():
        return profile
    local = dataclasses.replace(profile, flop_analysis=None, activation_analysis=None, ranks=())
    gathered: list[Optional[ModelProfile]] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    ranks = tuple(rank for rank in gathered if rank is not None)
    return dataclasses.replace(
        profile,
        root=combined_trees([(rank.root, 1) for rank in ranks], _one_sample_per_rank),
        ranks=ranks,
    )
