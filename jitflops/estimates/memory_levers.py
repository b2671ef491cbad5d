"""What would make a step fit that does not: the usual levers, each estimated on fake tensors.

Where even the smallest batch or length does not fit on a device, a user needs to know by how
much and what to change. Each lever is one ``memory_footprint`` on the same fake copy with one
option changed from the user's: for a training step, bfloat16 weights with float32 master weights,
activation checkpointing, 8-bit Adam, the three together, and the fewest FSDP2 ranks that fit (with
the user's settings, and with the three levers); for inference, bfloat16 weights and the fewest
tensor-parallel ranks. The rank counts are powers of 2 up to :data:`MOST_RANKS`, the search
starting where the unsharded estimate puts it; it stops where what sharding leaves whole
(activations, temporaries, inputs, outputs) overflows by itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
from torch import nn

from .devices import DeviceSpec
from .fake_sharding import ShardingError
from .memory_estimate import MemoryEstimate
from .memory_footprint import memory_footprint

MOST_RANKS = 1024
"""The largest number of ranks the sharding levers try."""

_SHARDED = ("parameters", "gradients", "optimizer_state")
"""What FSDP2 and tensor parallelism divide over the ranks: the rest of a rank's peak stays whole."""


@dataclass(frozen=True)
class LeverEstimate:
    """One lever: what it changes, in words and as ``memory_footprint`` options (the device aside),
    and its estimate (None where it cannot be estimated: ``reason`` says why)."""

    lever: str
    options: Mapping[str, Any]
    estimate: Optional[MemoryEstimate]
    fits: bool
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"lever": self.lever, "options": {key: str(value) if isinstance(value, torch.dtype) else value for key, value in self.options.items()},
                "peak": self.estimate.peak if self.estimate else None, "fits": self.fits, "reason": self.reason}


def _floating_dtype(model: nn.Module) -> Optional[torch.dtype]:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


def _training_levers(model: nn.Module, options: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The levers of a training step that change something here, by name: each the options it sets."""
    levers: dict[str, dict[str, Any]] = {}
    if (options.get("dtype") or _floating_dtype(model)) == torch.float32:
        levers["bfloat16 weights, float32 master weights"] = {"dtype": torch.bfloat16, "master_weights": True}
    if not options.get("checkpointing") and any(hasattr(model, switch) for switch in ("activation_checkpointing_enable", "gradient_checkpointing_enable")):
        levers["activation checkpointing"] = {"checkpointing": True}
    if str(options.get("train", "")).lower() in ("adam", "adamw"):
        levers["8-bit Adam"] = {"train": "adam8bit"}
    if len(levers) > 1:
        levers["all of the above"] = {key: value for changes in list(levers.values()) for key, value in changes.items()}
    return levers


def _estimate(model: nn.Module, inputs: Any, kwargs: Optional[Mapping[str, Any]], device: DeviceSpec, lever: str,
              options: Mapping[str, Any]) -> LeverEstimate:
    try:
        estimate = memory_footprint(model, inputs, kwargs, device=device, **options)
    except (ShardingError, ValueError) as error:
        return LeverEstimate(lever, options, None, False, str(error).splitlines()[0])
    return LeverEstimate(lever, options, estimate, estimate.fits(device))


def _fewest_ranks(model: nn.Module, inputs: Any, kwargs: Optional[Mapping[str, Any]], device: DeviceSpec, label: str, option: str,
                  options: Mapping[str, Any], unsharded: Optional[MemoryEstimate]) -> LeverEstimate:
    """The fewest ranks (a power of 2) over which ``option`` (``fsdp`` or ``tensor_parallel``)
    shards the step so that it fits, or why none does. The search starts where the ``unsharded``
    estimate's shardable bytes (parameters, gradients, optimizer state) over what the device has
    beside the rest puts it, and checks the count below."""
    ranks = 2
    if unsharded is not None:
        shardable = sum(unsharded.at_peak.get(category, 0) for category in _SHARDED)
        room = unsharded.capacity_of(device) - (unsharded.needed() - shardable)
        ranks = max(2, 1 << max(0, math.ceil(math.log2(shardable / room))) if room > 0 else 2)
    fitting: Optional[LeverEstimate] = None
    while 2 <= ranks <= MOST_RANKS:
        result = _estimate(model, inputs, kwargs, device, f"{label} over {ranks} ranks (the fewest that fit)", {**options, option: ranks})
        if result.estimate is None:
            return result
        if result.fits:
            fitting, ranks = result, ranks // 2  # does half as many fit too?
            continue
        if fitting is not None:
            return fitting
        whole = result.estimate.needed() - sum(result.estimate.at_peak.get(category, 0) for category in _SHARDED)
        if whole > result.estimate.capacity_of(device):
            return LeverEstimate(label, result.options, result.estimate, False,
                                 f"over {ranks} ranks, what it leaves whole (activations, temporaries) does not fit by itself")
        ranks *= 2
    return fitting or LeverEstimate(label, {**options, option: MOST_RANKS}, None, False, f"not over {MOST_RANKS} ranks")


def what_would_fit(model: nn.Module, inputs: Any, kwargs: Optional[Mapping[str, Any]], device: DeviceSpec,
                   options: Mapping[str, Any], estimate: Optional[MemoryEstimate] = None) -> list[LeverEstimate]:
    """Each lever the step ``memory_footprint(model, inputs, kwargs, device=device, **options)`` has,
    estimated: what it needs and whether it fits on ``device``. ``estimate``: that step's, where it
    was made (the search for the fewest ranks starts from it)."""
    if options.get("train") is None:
        estimates = []
        if (options.get("dtype") or _floating_dtype(model)) == torch.float32:
            estimates.append(_estimate(model, inputs, kwargs, device, "bfloat16 weights", {**options, "dtype": torch.bfloat16}))
        if not options.get("tensor_parallel"):
            estimates.append(_fewest_ranks(model, inputs, kwargs, device, "tensor parallelism", "tensor_parallel", options, estimate))
        return estimates
    levers = _training_levers(model, options)
    estimates = [_estimate(model, inputs, kwargs, device, lever, {**options, **changes}) for lever, changes in levers.items()]
    if not options.get("fsdp") and not options.get("tensor_parallel"):
        estimates.append(_fewest_ranks(model, inputs, kwargs, device, "FSDP2", "fsdp", options, estimate))
        if "all of the above" in levers:
            combined = next(lever.estimate for lever in estimates if lever.lever == "all of the above")
            estimates.append(_fewest_ranks(model, inputs, kwargs, device, "FSDP2 with all of the above", "fsdp", {**options, **levers["all of the above"]}, combined))
    return estimates

