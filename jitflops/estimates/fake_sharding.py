"""FSDP2 and tensor parallelism on one process: a fake process group of ``world_size`` ranks, and
``fully_shard`` applied to a model's copy the way training scripts do (each repeated block, then
the root), or ``parallelize_module`` with a tensor-parallel plan (the model's own, transformers'
``base_model_tp_plan``, or one given).

torch's fake process group (``torch.testing._internal.distributed.fake_pg``, which
``FSDPMemTracker``'s own tests use) completes every collective at once without moving data, so a
copy of the model on fake tensors runs as rank 0 of ``world_size`` would: its parameters, gradients
and optimizer state are shards, and each block's parameters are all-gathered for its forward and
backward and freed after, as FSDP2 frees them; under tensor parallelism its weights and the
activations between a column-wise and a row-wise layer are rank 0's shards.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

import torch.distributed as dist
from torch import nn


class ShardingError(RuntimeError):
    """A sharded estimate that cannot run here: a process group exists, no block to shard was found,
    or a tensor-parallel plan names a style torch has no ``ParallelStyle`` for."""


@contextmanager
def fake_process_group(world_size: int, tensor_parallel: Optional[int] = None) -> Iterator["dist.DeviceMesh"]:
    """A default process group of ``world_size`` fake ranks (this process is rank 0) and its 1-D mesh;
    with ``tensor_parallel``, a 2-D mesh of ``world_size // tensor_parallel`` data-parallel by
    ``tensor_parallel`` ranks, named ``dp`` and ``tp`` (torchtitan's and torch's tutorials' order:
    tensor parallelism innermost). The process is left as it was: torch's ``init_process_group``
    wraps ``sys.excepthook`` to prefix every later traceback with ``[rank0]:`` and its
    ``destroy_process_group`` leaves the wrapper, one more layer an estimate."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ShardingError("a process group is initialised already: estimate FSDP2 shards in a process of its own, before init_process_group")
    excepthook = sys.excepthook
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        if tensor_parallel is None:
            yield init_device_mesh("cpu", (world_size,))
        else:
            yield init_device_mesh("cpu", (world_size // tensor_parallel, tensor_parallel), mesh_dim_names=("dp", "tp"))
    finally:
        dist.destroy_process_group()
        sys.excepthook = excepthook
        # DTensor caches each op's sharding by its meshes, which hash by their ranks: a real mesh of
        # the same shape built later would be handed the fake one's process groups
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache

        _clear_sharding_prop_cache()



def _shares_weights_outside(unit: nn.Module, holders: Mapping[int, list[int]]) -> bool:
    """Whether a parameter of ``unit`` is also held by a module outside it (a tied embedding): FSDP2
    shards it with the root then. ``holders``: each parameter's holding modules, by id (:func:`_holders`)."""
    inside = {id(module) for module in unit.modules()}
    return any(holder not in inside for p in unit.parameters() for holder in holders[id(p)])


def _holders(model: nn.Module) -> dict[int, list[int]]:
    """The ids of the modules that hold each parameter of ``model`` as their own, by the parameter's id."""
    holders: dict[int, list[int]] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            holders.setdefault(id(p), []).append(id(module))
    return holders


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
    holders = _holders(model)
    units = [unit for unit in candidates if not _shares_weights_outside(unit, holders)]
    if not units:
        raise ShardingError(f"{type(model).__name__} names no blocks to shard (_no_split_modules): give the block classes (fsdp_units=[...])")
    return units


def shard_like_fsdp2(model: nn.Module, mesh: "dist.DeviceMesh", unit_types: Optional[Sequence[type]] = None) -> None:
    """``fully_shard`` on each unit of ``model`` (:func:`sharding_units`), then on the model."""
    from torch.distributed.fsdp import fully_shard

    for unit in sharding_units(model, unit_types):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)


TensorParallelPlan = Mapping[str, Union[str, Any]]
"""Module names (``*`` matching any one name, as ``parallelize_module`` reads them) to a torch
``ParallelStyle`` or the name of one (:func:`parallel_styles`)."""


def parallel_styles() -> dict[str, Any]:
    """The style names of transformers' tensor-parallel plans that torch's Megatron styles are:
    a vocabulary-parallel embedding, or a row-wise layer splitting a whole input, is
    ``RowwiseParallel`` of a replicated input (as torchtitan's embedding); a replicated module
    (whose gradient is all-reduced: ``replicated_with_grad_allreduce``, and DeepSeek's latent
    attention's ``mla_kv_a_proj``, whose rotary part's gradient is; ``replicate``) is left as it
    is: None. Its memory is the same; the all-reduce of its gradient is not recorded."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"colwise": ColwiseParallel(), "rowwise": RowwiseParallel(), "colwise_gather_output": ColwiseParallel(output_layouts=Replicate()),
            "embedding_rowwise": RowwiseParallel(input_layouts=Replicate()), "rowwise_split_input": RowwiseParallel(input_layouts=Replicate()),
            "replicated_with_grad_allreduce": None, "mla_kv_a_proj": None, "replicate": None}


def tensor_parallel_plan(model: nn.Module, plan: Optional[TensorParallelPlan] = None) -> dict[str, Any]:
    """The plan for ``parallelize_module`` on ``model``, styles resolved: ``plan``, or the transformers
    model's own (the ``_tp_plan`` it builds from its config's ``base_model_tp_plan`` and its head's)."""
    if plan is None:
        plan = getattr(model, "_tp_plan", None) or {}
        base = getattr(model, "base_model", model)
        if not plan and base is not model:
            prefix = getattr(model, "base_model_prefix", "")
            plan = {f"{prefix}.{name}": style for name, style in (getattr(model.config, "base_model_tp_plan", None) or {}).items()}
        if not plan:
            raise ShardingError(f"{type(model).__name__} has no tensor-parallel plan (a transformers model's _tp_plan): give tp_plan={{name: style}}")
    styles = parallel_styles()
    unknown = sorted({style for style in plan.values() if isinstance(style, str) and style not in styles})
    if unknown:
        raise ShardingError(f"{type(model).__name__}'s tensor-parallel plan uses {', '.join(unknown)}, which torch has no ParallelStyle for "
                            f"(known: {', '.join(styles)}): give tp_plan={{name: ParallelStyle}}")
    resolved = {name: styles[style] if isinstance(style, str) else style for name, style in plan.items()}
    return {name: style for name, style in resolved.items() if style is not None}


def shard_like_tensor_parallel(model: nn.Module, mesh: "dist.DeviceMesh", plan: Optional[TensorParallelPlan] = None) -> None:
    """``parallelize_module`` on ``model`` with its plan (:func:`tensor_parallel_plan`)."""
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, mesh, tensor_parallel_plan(model, plan))
