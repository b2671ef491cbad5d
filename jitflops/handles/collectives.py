"""Collectives: what each one moves, read from its record by nccl-tests' definitions.

A collective does no arithmetic a FLOP counter counts, but it is the work sharded training adds,
so every collective is a known op: zero FLOPs, and bytes in :data:`COMMUNICATION_FORMULAS`. The
size of a collective is nccl-tests' (``doc/PERFORMANCE.md``): the bytes of the buffer the operation
is defined over (the whole gathered output of an all-gather, the whole input of a reduce-scatter
or an all-to-all, the tensor of an all-reduce, a broadcast or a send). Bus bytes scale it by what
each rank's link carries in a ring: ``2(n-1)/n`` for an all-reduce, ``(n-1)/n`` for all-gather,
reduce-scatter, all-to-all, gather and scatter, 1 for broadcast, reduce, send and receive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..core.process_groups import ProcessGroupMeta
from ..core.records import OpRecord, TensorMeta
from .registry import FormulaTable

COMMUNICATION_FORMULAS = FormulaTable("communication formulas")
"""Collectives, each counted as the bytes it moves under its collective's name (``all_reduce``)."""

BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
    "barrier": lambda n: 0.0,
}
"""nccl-tests' bus bandwidth factors: bus bytes = bytes x factor(group size)."""


@dataclass(frozen=True)
class Collective:
    """One collective call: which collective, over how many ranks, and how many bytes."""

    name: str
    group_size: int
    bytes: int

    @property
    def bus_bytes(self) -> float:
        return self.bytes * BUS_FACTORS[self.name](self.group_size)


def _bytes(value: Any) -> int:
    """The bytes of a tensor, or of every tensor in a (nested) list."""
    if isinstance(value, TensorMeta):
        return value.numel * (value.dtype.itemsize if value.dtype is not None else 4)
    if isinstance(value, (list, tuple)):
        return sum(_bytes(item) for item in value)
    return 0


def _group_size(op: OpRecord) -> int:
    group = op.arg("process_group") if op.has_arg("process_group") else op.arg("group_name")
    if isinstance(group, ProcessGroupMeta):
        return group.size
    return int(op.arg("group_size")) if op.has_arg("group_size") else 1


_SIZE_ARGUMENT: dict[str, tuple[str, str]] = {}
"""Each collective kind: its collective's name and the argument whose bytes are its size."""


def _collectives(name: str, argument: str, *kinds: str) -> None:
    for kind in kinds:
        _SIZE_ARGUMENT[kind] = (name, argument)
    COMMUNICATION_FORMULAS.register(*kinds, key=name)(lambda op: collective_of(op).bytes)


_collectives("all_reduce", "tensors", "c10d::allreduce_", "c10d::allreduce_coalesced_")
_collectives("all_reduce", "input", "_c10d_functional::all_reduce", "_c10d_functional::all_reduce_")
_collectives("all_reduce", "inputs", "_c10d_functional::all_reduce_coalesced", "_c10d_functional::all_reduce_coalesced_")
_collectives("all_gather", "output_tensor", "c10d::_allgather_base_")
_collectives("all_gather", "output_tensors", "c10d::allgather_")
_collectives("all_gather", "output_lists", "c10d::allgather_coalesced_")
_collectives("all_gather", "outputs", "c10d::allgather_into_tensor_coalesced_")
_collectives("all_gather", "out", "_c10d_functional::all_gather_into_tensor_out")
_collectives("all_gather", "<outputs>", "_c10d_functional::all_gather_into_tensor", "_c10d_functional::all_gather_into_tensor_coalesced", "_c10d_functional_autograd::all_gather_into_tensor")
_collectives("reduce_scatter", "input_tensor", "c10d::_reduce_scatter_base_")
_collectives("reduce_scatter", "input_tensors", "c10d::reduce_scatter_")
_collectives("reduce_scatter", "inputs", "c10d::reduce_scatter_tensor_coalesced_", "_c10d_functional::reduce_scatter_tensor_coalesced")
_collectives("reduce_scatter", "input", "_c10d_functional::reduce_scatter_tensor", "_c10d_functional::reduce_scatter_tensor_out", "_c10d_functional_autograd::reduce_scatter_tensor")
_collectives("all_to_all", "input", "c10d::alltoall_base_", "_c10d_functional::all_to_all_single", "_c10d_functional_autograd::all_to_all_single")
_collectives("all_to_all", "input_tensors", "c10d::alltoall_")
_collectives("broadcast", "tensors", "c10d::broadcast_")
_collectives("broadcast", "input", "_c10d_functional::broadcast", "_c10d_functional::broadcast_")
_collectives("reduce", "tensors", "c10d::reduce_")
_collectives("gather", "output_tensors", "c10d::gather_")
_collectives("scatter", "input_tensors", "c10d::scatter_")
_collectives("send", "tensors", "c10d::send")
_collectives("send", "tensor", "_c10d_functional::isend")
_collectives("recv", "tensors", "c10d::recv_", "c10d::recv_any_source_")
_collectives("recv", "tensor", "_c10d_functional::irecv")
_collectives("barrier", "tensor", "c10d::barrier", "c10d::monitored_barrier_")


def collective_of(op: OpRecord) -> Collective:
    """What the collective call ``op`` moves (its kind must be one of :data:`COMMUNICATION_FORMULAS`)."""
    name, argument = _SIZE_ARGUMENT[op.kind]
    size = _bytes(op.outputs) if argument == "<outputs>" else _bytes(op.arg(argument))
    return Collective(name, _group_size(op), 0 if name == "barrier" else size)
