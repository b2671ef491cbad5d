"""What jitflops reads of ``torch.distributed``: DTensor's class, and process groups as plain data.

A collective's record names its process group as the op received it: a ``ProcessGroup`` boxed in a
``ScriptObject`` (``c10d::`` ops) or a group name (functional collectives). Records keep what the
formulas need of it, its size and name, read while the group exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .imported_classes import imported_class
from .tied_weights import distinct_named_parameters


@dataclass(frozen=True)
class ProcessGroupMeta:
    """The process group a collective ran over: how many ranks, and its name."""

    size: int
    name: str


def ranks_may_communicate() -> bool:
    """Whether this process is one of several ranks of an initialised process group: a model's
    forward may then run collectives (DTensor's, FSDP's, DDP's buffer broadcasts, a model's own),
    which every rank must run at the same point of its program."""
    distributed = torch.distributed
    return distributed.is_available() and distributed.is_initialized() and distributed.get_world_size() > 1


def dtensor_class() -> Optional[type]:
    """``torch.distributed.tensor.DTensor``, where it is imported."""
    return imported_class("torch.distributed.tensor", "DTensor")


def fsdp_module_class() -> Optional[type]:
    """FSDP2's ``FSDPModule``, what ``fully_shard`` makes a module, where it is imported."""
    return imported_class("torch.distributed.fsdp", "FSDPModule")


def dispatches_to_dtensor(types: Any) -> bool:
    """Whether an op reaching a dispatch mode has DTensor arguments (``types``): such an op is left
    to DTensor (``NotImplemented``, as ``CommDebugMode`` does), which runs it on this rank's shards
    and redistributes with collectives, each of which reaches the mode in turn."""
    dtensor = dtensor_class()
    return dtensor is not None and any(issubclass(t, dtensor) for t in types)


def is_dtensor(value: Any) -> bool:
    """By class: a lazy module's uninitialised parameter answers ``isinstance`` with any tensor class."""
    dtensor = dtensor_class()
    return dtensor is not None and issubclass(type(value), dtensor)


def process_group_meta(value: Any) -> Any:
    """A process group argument (boxed ``ProcessGroup``, ``ProcessGroup`` or group name) as a
    :class:`ProcessGroupMeta`; any other value unchanged (a ``ReduceOp``, a name no group has)."""
    if not torch.distributed.is_available():
        return value
    from torch.distributed import ProcessGroup
    from torch.distributed.distributed_c10d import _resolve_process_group

    group: Optional[ProcessGroup] = None
    if isinstance(value, ProcessGroup):
        group = value
    elif isinstance(value, torch.ScriptObject) and value._type().qualified_name().endswith("c10d.ProcessGroup"):
        group = ProcessGroup.unbox(value)
    elif isinstance(value, str):
        try:
            group = _resolve_process_group(value)
        except (ValueError, RuntimeError, KeyError):
            return value
    return ProcessGroupMeta(group.size(), group.group_name) if group is not None else value


DATA_PARALLEL_DIMS = frozenset({"dp", "dp_shard", "dp_replicate", "fsdp", "hsdp", "ddp", "data", "data_parallel", "replicate", "shard"})
"""Device mesh dimension names that mean data parallelism (torchtitan's and the tutorials' names)."""


def _model_parallel_dims(mesh: Any, sharded_by_fsdp: bool) -> list[int]:
    """The dimensions of ``mesh`` that split the model (not the data): by name (:data:`DATA_PARALLEL_DIMS`);
    an unnamed one-dimensional mesh is data-parallel under FSDP2 and model-parallel otherwise."""
    names = mesh.mesh_dim_names
    if names is None:
        return [] if sharded_by_fsdp and mesh.ndim == 1 else list(range(mesh.ndim))
    return [index for index, name in enumerate(names) if name not in DATA_PARALLEL_DIMS]


def _is_sharded_by_fsdp(model: Any) -> bool:
    fsdp = fsdp_module_class()
    return fsdp is not None and any(isinstance(module, fsdp) for module in model.modules())


def mesh_model_parallel_size(model: Any) -> Optional[int]:
    """How many ranks share one copy of the model, from the device mesh of its DTensor parameters:
    the product of the mesh's model-parallel dimensions. None where no parameter is a DTensor."""
    meshes = [parameter.device_mesh for parameter in model.parameters() if is_dtensor(parameter)]
    if not meshes:
        return None
    mesh = max(meshes, key=lambda each: each.ndim)
    return math.prod(mesh.size(index) for index in _model_parallel_dims(mesh, _is_sharded_by_fsdp(model)))


def compute_numels(model: Any) -> dict[str, int]:
    """The elements of each parameter this rank computes with: a DTensor's share along the mesh's
    model-parallel dimensions (its data-parallel shards, FSDP's, are gathered for the compute);
    a tensor's numel otherwise (0 for a lazy module's parameter that has no size yet)."""
    from torch.nn.parameter import UninitializedTensorMixin

    sharded_by_fsdp: Optional[bool] = None
    numels = {}
    for name, parameter in distinct_named_parameters(model):
        if isinstance(parameter, UninitializedTensorMixin):
            numels[name] = 0
            continue
        if not is_dtensor(parameter):
            numels[name] = parameter.numel()
            continue
        if sharded_by_fsdp is None:
            sharded_by_fsdp = _is_sharded_by_fsdp(model)
        mesh = parameter.device_mesh
        split = math.prod(
            mesh.size(index) for index in _model_parallel_dims(mesh, sharded_by_fsdp) if parameter.placements[index].is_shard()
        )
        numels[name] = parameter.numel() // split
    return numels
