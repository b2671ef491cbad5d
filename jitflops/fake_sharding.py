"""FSDP2 on one process: a fake process group of ``world_size`` ranks, and ``fully_shard`` applied to
a model's copy the way training scripts do (each repeated block, then the root).

torch's fake process group (``torch.testing._internal.distributed.fake_pg``, which
``FSDPMemTracker``'s own tests use) completes every collective at once without moving data, so a
copy of the model on fake tensors runs as rank 0 of ``world_size`` would: its parameters, gradients
and optimizer state are shards, and each block's parameters are all-gathered for its forward and
backward and freed after, as FSDP2 frees them.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

import torch.distributed as dist
from torch import nn


class ShardingError(RuntimeError):
    """A sharded estimate that cannot run here: a process group exists, or no block to shard was found."""


@contextmanager
def fake_process_group(world_size: int) -> Iterator["dist.DeviceMesh"]:
    """A default process group of ``world_size`` fake ranks (this process is rank 0) and its 1-D mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ShardingError("a process group is initialised already: estimate FSDP2 shards in a process of its own, before init_process_group")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


def _shares_weights_outside(unit: nn.Module, model: nn.Module) -> bool:
    """Whether a parameter of ``unit`` is also held by a module outside it (a tied embedding): FSDP2
    shards it with the root then."""
    inside = {id(module) for module in unit.modules()}
    own = {id(p) for p in unit.parameters()}
    return any(id(p) in own for module in model.modules() if id(module) not in inside for p in module.parameters(recurse=False))


def sharding_units(model: nn.Module, unit_types: Optional[Sequence[type]] = None) -> list[nn.Module]:
    """The modules ``fully_shard`` is applied to before the root: those of ``unit_types``, else those
    a transformers model names in ``_no_split_modules`` (its decoder or encoder layers); a module
    whose weights are tied to one outside it is left to the root."""
    if unit_types:
        wanted = tuple(unit_types)
        candidates = [module for module in model.modules() if isinstance(module, wanted) and module is not model]
    else:
        names = set(getattr(model, "_no_split_modules", None) or ())
        candidates = [module for module in model.modules() if type(module).__name__ in names and module is not model]
    units = [unit for unit in candidates if not _shares_weights_outside(unit, model)]
    if not units:
        raise ShardingError(f"{type(model).__name__} names no blocks to shard (_no_split_modules): give the block classes (fsdp_units=[...])")
    return units


def shard_like_fsdp2(model: nn.Module, mesh: "dist.DeviceMesh", unit_types: Optional[Sequence[type]] = None) -> None:
    """``fully_shard`` on each unit of ``model`` (:func:`sharding_units`), then on the model."""
    from torch.distributed.fsdp import fully_shard

    for unit in sharding_units(model, unit_types):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
