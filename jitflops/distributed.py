"""Profiles of multi-process runs: gathered across ranks, printed and written by rank 0.

When ``torch.distributed`` is initialised, every rank profiles its own share of the work; then
:func:`gather_profile` combines them on every rank:

* counts (MACs per op, elementwise FLOPs, activations) are summed over the ranks;
* a module's latency becomes the ranks' median latencies, one sample per rank, so its ``max`` is
  the slowest rank and its ``mean`` the mean over ranks (the JSON export has both);
* parameters stay per rank (DeepSpeed's "params per GPU"), as does the summary;
* each rank's own profile stays available, as a JSON document, in ``ModelProfile.ranks``.

Only rank 0 prints profiles and writes files. Gathering is a collective call: every rank must ask
for the same profiles (``profile_model``, ``FlopsProfiler.profile``/``print_model_profile``/
``get_total_*``), as with any ``torch.distributed`` collective.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Optional

import torch.distributed as dist

from .hierarchy import ModuleProfile
from .timing import LatencyStats


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def is_writer() -> bool:
    """Whether this process prints and writes: rank 0, or the only process."""
    return not is_distributed() or dist.get_rank() == 0


def _module_figures(root: ModuleProfile) -> dict[str, dict[str, Any]]:
    return {
        node.name: {
            "macs_by_op": dict(node.macs_by_op),
            "elementwise_flops_by_op": dict(node.elementwise_flops_by_op),
            "activations": node.activations,
            "latency_median": node.latency.median if node.latency else None,
        }
        for node in root.walk()
    }


def _combined(node: ModuleProfile, per_rank: list[dict[str, dict[str, Any]]]) -> ModuleProfile:
    figures = [rank[node.name] for rank in per_rank if node.name in rank]
    medians = [f["latency_median"] for f in figures]
    return dataclasses.replace(
        node,
        macs_by_op=sum((Counter(f["macs_by_op"]) for f in figures), Counter()),
        elementwise_flops_by_op=sum((Counter(f["elementwise_flops_by_op"]) for f in figures), Counter()),
        activations=sum(f["activations"] for f in figures),
        latency=LatencyStats(tuple(medians)) if medians and None not in medians else None,
        children=[_combined(child, per_rank) for child in node.children],
    )


def gather_profile(profile: Any) -> Any:
    """The :class:`~jitflops.profile.ModelProfile` of all ranks together (unchanged in one process)."""
    from .export import profile_to_dict

    if not is_distributed():
        return profile
    local = {"modules": _module_figures(profile.root), "document": profile_to_dict(profile)}
    gathered: list[Optional[dict[str, Any]]] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    per_rank = [rank["modules"] for rank in gathered if rank is not None]
    return dataclasses.replace(
        profile,
        root=_combined(profile.root, per_rank),
        ranks=tuple(rank["document"] for rank in gathered if rank is not None),
    )
