"""The per-operator table: every op the forward ran, with its module, shapes, FLOPs, time and memory.

Time, shapes and memory come from ``torch.profiler`` (CPU time on the CPU, device time on a GPU;
the profiler's memory events, which follow the CUDA caching allocator on a GPU). Collectives are
rows too, with their time. Each module call
opens a profiler range, so every top-level op knows its module. FLOPs come from the JIT analysis:
its op counts are matched to the profiled ops, module by module and in order, by op family (the
trace may record ``aten::_convolution`` where the eager run records ``aten::conv2d``).
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
from torch import nn
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from ..engine.counting import OpCount
from ..core.records import FORWARD
from ..handles import ELEMENTWISE_FLOP_FORMULAS, FLOP_FORMULAS, Handle, ShapeFormula
from ..core.model_guard import preserved
from ..core.running_module import failures_named, hookable_modules
from ..core.model_io import ModelCall
from ..timing.timed_pass import model_device, refuse_meta

MODULE_RANGE_PREFIX = "jitflops.module:"
_OP_NAMESPACES = ("aten::", "c10d::", "_c10d_functional::")
"""The profiler events that are ops: aten's, and collectives (timed with the rest, where the backend runs them on the CPU)."""


@dataclass(frozen=True)
class OpRow:
    """One executed top-level op. MACs as counted by the analysis (None: not a counted op), and
    the flops of elementwise ops (counted with ``elementwise=True``), which are not MACs.
    Memory in bytes allocated just before and just after the op (allocations minus frees, all ops
    and tensors included): relative to the start of the forward on the CPU, absolute on a GPU."""

    index: int
    module: str
    op: str
    input_shapes: tuple[Any, ...]
    macs: Optional[float]
    time_s: float
    memory_before: int
    memory_after: int
    elementwise_flops: float = 0
    bytes: Optional[float] = None
    """Bytes the op reads and writes (:class:`~jitflops.ByteCountAnalysis`; None: not matched)."""

    @property
    def flops(self) -> Optional[float]:
        return None if self.macs is None else 2 * self.macs + self.elementwise_flops

    @property
    def intensity(self) -> Optional[float]:
        """FLOPs per byte read or written (None: no bytes, or no count)."""
        return self.flops / self.bytes if self.flops is not None and self.bytes else None

    @property
    def memory_delta(self) -> int:
        return self.memory_after - self.memory_before

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "module": self.module,
            "op": self.op,
            "input_shapes": [list(shape) if isinstance(shape, (list, tuple)) else shape for shape in self.input_shapes],
            "macs": self.macs,
            "flops": self.flops,
            "elementwise_flops": self.elementwise_flops,
            "bytes": self.bytes,
            "intensity": self.intensity,
            "time_s": self.time_s,
            "memory_before": self.memory_before,
            "memory_after": self.memory_after,
            "memory_delta": self.memory_delta,
        }


class _ModuleRanges:
    """Forward hooks that open a profiler range per module call."""

    def __init__(self, names: Mapping[nn.Module, str]) -> None:
        self.names = names
        self._open: list[record_function] = []

    def install(self, model: nn.Module) -> None:
        for module, name in hookable_modules(model, self.names):
            module.register_forward_pre_hook(self._enter(name))
            module.register_forward_hook(self._exit, always_call=True)

    def _enter(self, name: str):
        def hook(module: nn.Module, args: Any) -> None:
            scope = record_function(MODULE_RANGE_PREFIX + name)
            scope.__enter__()
            self._open.append(scope)

        return hook

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        self._open.pop().__exit__(None, None, None)


def _module_of(event: Any) -> Optional[str]:
    """The innermost module range above a top-level op, or None if the event is nested in another op."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(MODULE_RANGE_PREFIX):
            return parent.name[len(MODULE_RANGE_PREFIX):]
        if parent.name.startswith(_OP_NAMESPACES):
            return None
        parent = parent.cpu_parent
    return ""


def _family(kind: str, handle: Optional[Handle], formulas: Mapping[str, ShapeFormula]) -> object:
    """What identifies an op across front ends: its flop formula, else its kind."""
    formula = handle if isinstance(handle, ShapeFormula) else formulas.get(kind)
    return formula.compute if formula is not None else kind


def _match_counts(rows: list[tuple[str, list[str]]], op_counts: tuple[OpCount, ...], by_handle: bool = True) -> list[tuple[Optional[float], float]]:
    """For each row, the count of the next unmatched counted op of the same family in that module,
    as (MACs, elementwise flops). ``by_handle=False`` tells a counted op's family by its kind alone
    (the handles of other statistics, bytes, are not the FLOP formulas that name families).

    A row is a module and the names of a top-level op and of the ops it ran, outermost first: the
    op itself matches when it was counted as such (the JIT's ``aten::linear``), otherwise the ops it
    ran (the dispatch backend's ``aten::addmm`` under ``aten::linear``) are matched and added up.
    """
    formulas = FLOP_FORMULAS.handles() | ELEMENTWISE_FLOP_FORMULAS.handles()
    elementwise = ELEMENTWISE_FLOP_FORMULAS.kinds()
    pending: dict[tuple[str, object], deque[tuple[float, float]]] = defaultdict(deque)
    for count in op_counts:
        if count.phase == FORWARD:
            split = (0.0, count.count) if count.kind in elementwise else (count.count, 0.0)
            pending[(count.module, _family(count.kind, count.handle if by_handle else None, formulas))].append(split)
    matched: list[tuple[Optional[float], float]] = []
    for module, (op, *inner_ops) in rows:
        queue = pending.get((module, _family(op, None, formulas)))
        if queue:
            matched.append(queue.popleft())
            continue
        inner = [pending[key].popleft() for key in ((module, _family(name, None, formulas)) for name in inner_ops) if pending.get(key)]
        matched.append((sum(m for m, _ in inner), sum(e for _, e in inner)) if inner else (None, 0.0))
    return matched


def _descendant_names(event: Any) -> list[str]:
    names = []
    for child in event.cpu_children:
        names.append(child.name)
        names.extend(_descendant_names(child))
    return names


def _profiled_pass(model: nn.Module, call: ModelCall, activities: list[ProfilerActivity], device: torch.device) -> tuple[list[tuple[Any, str]], list[tuple[int, int]], int]:
    """One forward under ``torch.profiler``: its top-level ops with their modules, in order, the
    memory events, and the memory allocated at the start."""
    start_memory = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    with profile(activities=activities, record_shapes=True, profile_memory=True) as profiler:
        call.run(model)
    ops, memory_events = [], []
    for event in profiler.events():
        # An op's own allocations and frees are charged to it (net), frees after ops to "[memory]"
        # events: place net allocations at the op's start and net frees at its end.
        delta = event.self_device_memory_usage if device.type == "cuda" else event.self_cpu_memory_usage
        if delta:
            memory_events.append((event.time_range.start if delta > 0 else event.time_range.end, delta))
        if event.name.startswith(_OP_NAMESPACES):
            module = _module_of(event)
            if module is not None:
                ops.append((event, module))
    ops.sort(key=lambda item: item[0].time_range.start)
    memory_events.sort()
    return ops, memory_events, start_memory


def op_table(
    model: nn.Module, call: ModelCall, names: Mapping[nn.Module, str], op_counts: tuple[OpCount, ...], warm_up: int = 1, repeats: int = 1,
    byte_counts: tuple[OpCount, ...] = (),
) -> list[OpRow]:
    """One row per top-level op of the forward: ``warm_up`` untimed forwards, then ``repeats``
    forwards under ``torch.profiler``; each op's time is its median over those, its shapes and
    memory are the last pass's; ``byte_counts`` (a :class:`~jitflops.ByteCountAnalysis`'s op
    counts) give each its bytes, matched as the FLOP counts are."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    refuse_meta(model, call, "the op table of")
    device = model_device(model, call)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    ranges = _ModuleRanges(names)
    with preserved(model), torch.no_grad(), failures_named(model, names, "profiling"):
        ranges.install(model)
        for _ in range(warm_up):
            call.run(model)
        passes = [_profiled_pass(model, call, activities, device) for _ in range(repeats)]
    ops, memory_events, start_memory = passes[-1]

    def seconds(event: Any) -> float:
        return (event.device_time_total if device.type == "cuda" else event.cpu_time_total) / 1e6

    same_ops = [p[0] for p in passes if [event.name for event, _ in p[0]] == [event.name for event, _ in ops]]
    times = [statistics.median(seconds(run[i][0]) for run in same_ops) for i in range(len(ops))]
    moments = [time for time, _ in memory_events]
    running = list(itertools.accumulate((delta for _, delta in memory_events), initial=start_memory))
    names_of_rows = [(module, [event.name, *_descendant_names(event)]) for event, module in ops]
    counts = _match_counts(names_of_rows, op_counts)
    # the bytes' matches split as MACs and elementwise flops are: an op's bytes are their sum
    traffic = [None if first is None and not second else (first or 0) + second for first, second in _match_counts(names_of_rows, byte_counts, by_handle=False)]
    rows = []
    for index, ((event, module), (macs, elementwise_flops), moved, time_s) in enumerate(zip(ops, counts, traffic, times)):
        before = running[bisect.bisect_left(moments, event.time_range.start)]
        after = running[bisect.bisect_right(moments, event.time_range.end)]
        rows.append(OpRow(index, module, event.name, tuple(event.input_shapes), macs, time_s, before, after, elementwise_flops, moved))
    return rows
