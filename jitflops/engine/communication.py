"""Communication: the bytes each module's collectives move, per collective.

Sharded training adds collectives to the arithmetic: FSDP2 all-gathers parameters and
reduce-scatters gradients, tensor parallelism all-reduces partial sums, expert parallelism sends
tokens all-to-all, pipeline stages send and receive activations. :class:`CommunicationAnalysis`
counts them from the same recording as the FLOPs (the dispatch backend sees them as they run, in
the module that ran them), as bytes by nccl-tests' definitions (:mod:`jitflops.handles.collectives`).
"""

from __future__ import annotations

import typing
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..handles import COMMUNICATION_FORMULAS, FLOP_FORMULAS, Handle, collective_of
from ..handles.collectives import Collective
from .jit_analysis import JitModelAnalysis
from ..core.records import FORWARD

_DEFAULT_SUPPORTED_OPS: dict[str, Handle] = COMMUNICATION_FORMULAS.handles()


@dataclass(frozen=True)
class CollectiveCall:
    """One collective as it ran: the module that ran it (canonical name), the phase, what it moved."""

    module: str
    phase: str
    collective: Collective
    seconds: Optional[float] = None
    """The call's wall time, where it was timed (:func:`~jitflops.profiling.collective_recorder.record_collectives`)."""

    @property
    def key(self) -> str:
        """The collective's name, prefixed by a later phase as the engine keys counts (``backward.all_gather``)."""
        name = self.collective.name
        return name if self.phase == FORWARD else f"{self.phase}.{name}"


@dataclass(frozen=True)
class CollectiveTotals:
    """The calls of one collective summed: how many, over which group sizes, bytes and bus bytes."""

    name: str
    calls: int
    bytes: int
    bus_bytes: float
    group_sizes: tuple[int, ...]
    seconds: Optional[float] = None
    """The calls' wall time, summed, where they were timed."""

    def as_dict(self) -> dict[str, Any]:
        return {"collective": self.name, "calls": self.calls, "bytes": self.bytes, "bus_bytes": self.bus_bytes, "group_sizes": list(self.group_sizes), "seconds": self.seconds}


def totals_by_collective(calls: typing.Iterable[CollectiveCall]) -> dict[str, CollectiveTotals]:
    """Calls summed per :attr:`CollectiveCall.key`, in the order each was first met."""
    grouped: dict[str, list[CollectiveCall]] = defaultdict(list)
    for call in calls:
        grouped[call.key].append(call)
    return {
        key: CollectiveTotals(
            key,
            len(each),
            sum(call.collective.bytes for call in each),
            sum(call.collective.bus_bytes for call in each),
            tuple(sorted({call.collective.group_size for call in each})),
            None if any(call.seconds is None for call in each) else sum(call.seconds for call in each),
        )
        for key, each in grouped.items()
    }


def combined_totals(parts: typing.Iterable[tuple[Mapping[str, CollectiveTotals], int]]) -> tuple[CollectiveTotals, ...]:
    """The totals of several calls, each standing for ``weight`` calls (how often it ran)."""
    combined: dict[str, CollectiveTotals] = {}
    for totals, weight in parts:
        for key, each in totals.items():
            before = combined.get(key, CollectiveTotals(key, 0, 0, 0.0, (), 0.0))
            combined[key] = CollectiveTotals(
                key,
                before.calls + each.calls * weight,
                before.bytes + each.bytes * weight,
                before.bus_bytes + each.bus_bytes * weight,
                tuple(sorted(set(before.group_sizes) | set(each.group_sizes))),
                None if before.seconds is None or each.seconds is None else before.seconds + each.seconds * weight,
            )
    return tuple(combined.values())


def _within(module: str, ancestor: str) -> bool:
    return not ancestor or module == ancestor or module.startswith(ancestor + ".")


class CommunicationAnalysis(JitModelAnalysis):
    """Bytes moved by collectives, per module and per collective (``all_reduce``, ``all_gather``,
    ``reduce_scatter``, ``all_to_all``, ``broadcast``, ``send``, ``recv``…), by nccl-tests' size
    definitions; :meth:`by_collective` adds calls, bus bytes and group sizes.

    Collectives run only where a model is sharded, which the JIT cannot trace: such models are
    recorded by the dispatch backend (the default call's fallback). Every other op counts zero.

    >>> comm = CommunicationAnalysis(model, inputs, backend="dispatch", backward=True)
    >>> comm.total(), comm.by_module(), comm.by_collective()
    """

    @classmethod
    def _default_handles(cls) -> Mapping[str, Handle]:
        return _DEFAULT_SUPPORTED_OPS

    @classmethod
    def _default_ignored_ops(cls) -> frozenset[str]:
        return super()._default_ignored_ops() - COMMUNICATION_FORMULAS.kinds() | FLOP_FORMULAS.kinds()

    def collective_calls(self) -> tuple[CollectiveCall, ...]:
        """Every collective call, in the order it ran."""
        trace = self.scoped_trace()
        calls = []
        for kind, item in trace.operations():
            if kind in COMMUNICATION_FORMULAS.kinds() and kind in self._op_handles:
                module = trace.scope_of(item).rpartition("/")[2]
                record = trace.record(item, kind, module)
                calls.append(CollectiveCall(module, record.phase, collective_of(record)))
        return tuple(calls)

    def by_collective(self, module_name: str = "") -> dict[str, CollectiveTotals]:
        """The collectives of ``module_name`` (default: the whole model) and the modules it owns,
        summed per collective; keys as :meth:`by_operator`'s (``backward.`` for the backward's)."""
        name = self.canonical_module_name(module_name)
        return totals_by_collective(call for call in self.collective_calls() if _within(call.module, name))


def communication_of(analysis: JitModelAnalysis) -> Optional[CommunicationAnalysis]:
    """The communication of the call ``analysis`` recorded, from its recording (None: the JIT
    traced it, so nothing was sharded: a trace holds no collective)."""
    if analysis.counted_by != "dispatch":
        return None
    return analysis.of_same_recording(CommunicationAnalysis)
