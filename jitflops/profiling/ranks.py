"""Profiles of multi-process runs: gathered across ranks, printed and written by rank 0.

When ``torch.distributed`` is initialised, every rank profiles its own share of the work; then
:func:`profile_on_every_rank` combines them on every rank:

* counts (MACs per op, elementwise FLOPs, activations) are summed over the ranks;
* a module's latency becomes the ranks' median latencies, one sample per rank, so its ``max`` is
  the slowest rank and its ``mean`` the mean over ranks (the JSON export has both);
* parameters stay per rank (DeepSpeed's "params per GPU"), as does the summary;
* each rank's own profile stays available in ``ModelProfile.ranks`` (without its analyses).

Only rank 0 prints profiles and writes files. Gathering is a collective call: every rank must ask
for the same profiles (``profile_model``, ``FlopsProfiler.profile``/``print_model_profile``/
``get_total_*``), as with any ``torch.distributed`` collective.

Faults are told, never waited on forever (:func:`profile_on_every_rank`): a rank whose profile
raises still joins the gather, with its error, and every other rank raises an error naming it;
with gloo, a rank that does not come to the gather at all (it raised elsewhere, or does not
profile) is named by a ``monitored_barrier`` after :data:`RANK_TIMEOUT_S` seconds.
"""

from __future__ import annotations

import dataclasses
import os
from datetime import timedelta
from typing import Callable, Optional

import torch.distributed as dist

from ..core.errors import JitflopsError
from .hierarchy import combined_trees
from .model_profile import ModelProfile
from ..timing.timed_pass import LatencyStats


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def is_writer() -> bool:
    """Whether this process prints and writes: rank 0, or the only process."""
    return not is_distributed() or dist.get_rank() == 0


def _one_sample_per_rank(name: str, latencies: list[Optional[LatencyStats]]) -> Optional[LatencyStats]:
    return LatencyStats(tuple(stats.median for stats in latencies if stats is not None)) if latencies and None not in latencies else None


RANK_TIMEOUT_S = float(os.environ.get("JITFLOPS_RANK_TIMEOUT_S", "300"))
"""How long the ranks wait for each other at a profile's gather (gloo), in seconds."""


def _every_rank_arrives() -> None:
    """Wait for every rank at the gather; with gloo, name those that do not come in time."""
    if dist.get_backend() != "gloo":
        return  # monitored_barrier is gloo's: other backends wait up to their process group's timeout
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=RANK_TIMEOUT_S), wait_all_ranks=True)
    except RuntimeError as error:
        raise JitflopsError(
            f"rank {dist.get_rank()}: not every rank came to jitflops' profile gather within {RANK_TIMEOUT_S:g} s "
            f"(JITFLOPS_RANK_TIMEOUT_S): every rank must profile the same calls, and a rank that raised before "
            f"profiling never comes. {str(error).strip().splitlines()[0]}"
        ) from error


def profile_on_every_rank(local: Callable[[], ModelProfile]) -> ModelProfile:
    """This rank's profile (``local()``) gathered with every other rank's (unchanged in one process).

    If any rank's ``local()`` raises, every rank raises: that rank its own error, the others a
    :class:`~jitflops.core.errors.JitflopsError` naming the ranks that failed and why.
    """
    if not is_distributed():
        return local()
    failure: Optional[Exception] = None
    profile: Optional[ModelProfile] = None
    try:
        profile = local()
    except Exception as error:
        failure = error
    _every_rank_arrives()
    message = None if failure is None else f"{type(failure).__name__}: {str(failure).strip()}"
    gathered: list[Optional[tuple[Optional[str], Optional[ModelProfile]]]] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (message, None if profile is None else _without_analyses(profile)))
    failed = [(rank, item[0]) for rank, item in enumerate(gathered) if item is not None and item[0] is not None]
    if failure is not None:
        raise failure
    if failed:
        raise JitflopsError("; ".join(f"rank {rank} failed while profiling: {error}" for rank, error in failed) + f" (rank {dist.get_rank()} has no profile of the whole run)")
    assert profile is not None
    return _combined(profile, tuple(item[1] for item in gathered if item is not None and item[1] is not None))


def _without_analyses(profile: ModelProfile) -> ModelProfile:
    return dataclasses.replace(profile, flop_analysis=None, activation_analysis=None, ranks=())


def _combined(profile: ModelProfile, ranks: tuple[ModelProfile, ...]) -> ModelProfile:
    return dataclasses.replace(
        profile,
        root=combined_trees([(rank.root, 1) for rank in ranks], _one_sample_per_rank),
        ranks=ranks,
    )
