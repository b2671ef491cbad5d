"""Time predicted per op, summed per module: on a named device or this machine's calibrated spec, before the model runs.

Each op costs its kernel (:mod:`jitflops.estimates.costs`: read from the curve a calibration
measured for its family; on a datasheet device, the roofline ``max(FLOPs / (efficiency x peak),
bytes / (efficiency x bandwidth))`` plus a fixed cost per kernel) and the host's time of its eager
call, by what it is (an op, a view, a size read; a module entered costs a call too): how the two add
up is the execution mode's (:mod:`jitflops.estimates.execution`: on a CPU in turn, on a GPU as
two streams, with CUDA graphs the kernels alone). FLOPs are 2 x the MACs of the FLOP formulas, bytes
the op's traffic (:mod:`jitflops.handles.traffic`). What the model leaves out: fusion (each op is its
own kernel), the overlap of communication with compute, and caches between ops. It is counted from
the same recording as the FLOPs, on meta or fake tensors too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator, Optional, Union

import torch
from torch import nn

from ..core.op_source import OpSource
from ..core.process_groups import is_dtensor
from ..core.records import FORWARD, OpRecord
from ..core.tied_weights import distinct_parameters
from ..engine.counting import Statistics, run_handle, statistics_of
from ..engine.jit_analysis import JitModelAnalysis
from ..frontends.dispatch_trace import WHOLE_CALLS
from ..frontends.program_source import ProgramSource
from ..handles import FLOP_FORMULAS, Handle, ShapeFormula
from ..handles.convolution import CUDNN_TF32_KINDS
from ..handles.traffic import BYTES_FORMULAS, METADATA_OPS, TrafficFormulas
from .costs import FUSED_WHEN_COMPILED, compute_dtype, kernel_seconds, roofline_seconds  # noqa: F401  (the roofline's names where they were)
from .costs.fresh_pages import fresh_pages
from .devices import DeviceSpec, device_spec, is_cpu_spec
from .execution import MODES, Timeline, host_kind, modules_entered

DeviceLike = Union[str, DeviceSpec, Mapping[str, Any]]

def tf32_allowed(kind: str) -> bool:
    """Whether a float32 op of ``kind`` may run on TF32 tensor cores: cuDNN's switch for the
    convolutions, the matmul switch for everything else (torch's defaults: on and off)."""
    return torch.backends.cudnn.allow_tf32 if kind in CUDNN_TF32_KINDS else torch.backends.cuda.matmul.allow_tf32


class OpTimes(Mapping[str, Handle]):
    """Every op's predicted seconds on ``spec`` in ``mode``: what it adds to the end of the run, ops
    taken in the order they ran (a :class:`~jitflops.estimates.execution.Timeline`). ``called``: the
    modules that ran (a module entered costs the host a call); ``parallel``: those whose own parameters
    are DTensors (a DTensor op in one costs the host its parallel style's conversions too);
    ``pages``: the pages each op faults in, by ``id`` of its record (:func:`~jitflops.estimates.heap_pages.heap_pages`),
    else its outputs' of 32 MiB and more (:func:`~jitflops.estimates.costs.fresh_pages.fresh_pages`)."""

    def __init__(self, spec: DeviceSpec, mode: str, flop_handles: Mapping[str, Handle], traffic: TrafficFormulas, called: frozenset[str],
                 parallel: frozenset[str] = frozenset(), pages: Optional[Mapping[int, int]] = None) -> None:
        self._spec, self._flops, self._traffic, self._called, self._parallel, self._pages = spec, flop_handles, traffic, called, parallel, pages
        self._timeline = Timeline(mode, overlapped=not is_cpu_spec(spec))
        self._module: Optional[str] = None
        self._call_host = 0.0
        """The host time charged so far to the Python call the last op belongs to."""
        self._formula = ShapeFormula(self.seconds)

    def kernel(self, op: OpRecord) -> float:
        """The seconds of ``op``'s kernel alone, the pages it faults in included (a calibrated CPU's time a page)."""
        flop_handle = self._flops.get(op.kind)
        flops = 2 * sum(run_handle(flop_handle, op).values()) if flop_handle is not None else 0
        byte_handle = self._traffic.get(op.kind)
        traffic = sum(run_handle(byte_handle, op).values()) if byte_handle is not None else 0
        pages = self._pages.get(id(op), 0) if self._pages is not None else fresh_pages(op) if traffic else 0  # a view maps nothing
        return kernel_seconds(op, self._spec, float(flops), float(traffic), tf32_allowed(op.kind)) + pages * self._spec.host_s.get("page", 0.0)

    def seconds(self, op: OpRecord) -> float:
        backward = op.phase != FORWARD
        kind = host_kind(op.kind, backward)
        if kind is None:  # bookkeeping, a profiler's marker
            return 0.0
        # a call costs the host what its costliest op does: F.linear's first op is a view (its weight's
        # transpose), its product comes after it, below the same call (the dispatch backend marks it nested)
        host = self._spec.host_seconds(kind)
        if getattr(op, "nested", False) and not backward:
            host, self._call_host = max(0.0, host - self._call_host), max(host, self._call_host)
        else:
            self._call_host = host
        if getattr(op, "dtensor_ops", 0):  # the DTensor ops it ran for
            host += op.dtensor_ops * self._spec.host_seconds("parallel_dtensor" if op.scope in self._parallel else "dtensor")
        if not backward:
            entered = modules_entered(self._module or "", op.scope, self._called) + (self._module is None)  # the model's own call first
            host += entered * self._spec.host_seconds("module") + getattr(op, "bytecode", 0) * self._spec.host_seconds("bytecode")
            self._module = op.scope
        return self._timeline.add(host, self.kernel(op), op.kind in FUSED_WHEN_COMPILED)

    def __getitem__(self, kind: str) -> Handle:
        return self._formula

    def __iter__(self) -> Iterator[str]:
        return iter(self._flops)

    def __len__(self) -> int:
        return len(self._flops)


class PredictedTimeAnalysis(JitModelAnalysis):
    """Predicted seconds per module and per operator on ``device`` (a name of the device table,
    ``"h100"``, a spec file from ``jitflops calibrate``, or a :class:`~jitflops.estimates.devices.DeviceSpec`;
    a model whose weights a calibrated CPU's cache holds gets its products at the cache's rates:
    :meth:`~jitflops.estimates.devices.DeviceSpec.for_weights`), in fvcore's shape: ``total()`` is
    the forward's (and, with ``backward=True``, the backward's) predicted time.

    A module is recorded by the dispatch backend unless ``backend`` says otherwise: it records the
    ops eager runs (the JIT's trace materialises masks an eager forward skips) on fake tensors laid
    out as the device lays them out, whose layout copies it prices (a meta copy, the JIT's, lays
    them out as the meta kernels do: SegFormer-B0 -25% against -15% on a 2-core EPYC), in half the
    JIT's time on a model built on meta.

    >>> PredictedTimeAnalysis(model, inputs, device="h100").by_module()
    """

    def __init__(self, model: Union[nn.Module, ProgramSource], inputs: Any = None, kwargs: Optional[Mapping[str, Any]] = None, *, device: DeviceLike = "h100",
                 mode: str = "eager", **front_end: Any) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self._given, self._mode = device_spec(device), mode
        self._spec = self._given  # a model whose weights the cache holds reads them from it
        if isinstance(model, nn.Module):
            self._spec = self._given.for_weights(sum(tensor.numel() * tensor.element_size() for tensor in distinct_parameters(model)))
        if mode == "graph" and is_cpu_spec(self._spec):
            raise ValueError(f"mode='graph': CUDA graphs replay a GPU's kernels, and {self._spec.name!r} is a CPU's spec")
        if isinstance(model, nn.Module):
            front_end.setdefault("backend", "dispatch")
        super().__init__(model, inputs, kwargs, **front_end)

    @property
    def device(self) -> DeviceSpec:
        return self._spec

    @property
    def mode(self) -> str:
        """The execution mode predicted (:data:`~jitflops.estimates.execution.MODES`)."""
        return self._mode

    @classmethod
    def _default_ignored_ops(cls) -> frozenset[str]:
        return frozenset()  # every op costs the host its call, a view or a size read too

    @classmethod
    def _counts_bytecode(cls) -> bool:
        """A prediction prices the model's Python between ops: its eager host time."""
        return True

    @classmethod
    def _whole_calls(cls) -> tuple[str, ...]:
        return WHOLE_CALLS

    def _new_like(self, model: nn.Module, inputs: Any, kwargs: Optional[Mapping[str, Any]]) -> "PredictedTimeAnalysis":
        return type(self)(model, inputs, kwargs, device=self._given, mode=self._mode, **self._front_end_settings())

    def _analyze(self, trace: OpSource) -> Statistics:
        return predicted_statistics(trace, self._spec, self._mode, self._aliases, self._op_handles, self._ignored_ops, self._ancestor_mode)


def predicted_statistics(recording: OpSource, spec: DeviceSpec, mode: str, aliases: Mapping[Any, str], traffic_handles: Mapping[str, Handle] = {},
                         ignored: frozenset[str] = frozenset(), ancestor_mode: str = "owner", pages: Optional[Mapping[int, int]] = None) -> Statistics:
    """The predicted seconds of every op of ``recording`` (a JIT trace, a dispatch recording) on
    ``spec`` in ``mode``, per module and per op, as an analysis' statistics (``traffic_handles``:
    handles that override the traffic formulas; ``pages``: the pages each op faults in, as :class:`OpTimes` takes them)."""
    traffic = TrafficFormulas({**BYTES_FORMULAS.handles(), **traffic_handles}, ignored | METADATA_OPS)  # views move nothing, and cost the host their call
    called = frozenset(name for scope in recording.scopes() for name in scope.split("/") if name)
    parallel = frozenset(name for module, name in aliases.items() if isinstance(module, nn.Module) and any(map(is_dtensor, module.parameters(recurse=False))))
    times = OpTimes(spec, mode, FLOP_FORMULAS.handles(), traffic, called, parallel, pages)
    return statistics_of(recording, times, ignored, aliases, ancestor_mode)


__all__ = ["BYTES_FORMULAS", "FLOP_FORMULAS", "METADATA_OPS", "MODES", "WHOLE_CALLS", "OpTimes", "PredictedTimeAnalysis", "compute_dtype",
           "predicted_statistics", "roofline_seconds", "tf32_allowed"]
