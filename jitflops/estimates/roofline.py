"""Time predicted from a roofline, per op, summed per module: on a named device, before the model runs.

Each op takes ``max(FLOPs / (efficiency x peak for its dtype), bytes / (efficiency x bandwidth))``
plus a fixed cost per kernel (:class:`~jitflops.estimates.devices.DeviceSpec`; a calibrated spec's compute
efficiency follows the op's size: small products reach less of the peak); FLOPs are 2 x the MACs of the
FLOP formulas, bytes the op's traffic (:mod:`jitflops.handles.traffic`). Ops that move nothing (views)
take no time. What the model leaves out: fusion (each op is its own kernel, reading and writing its
tensors), the overlap of communication with compute, and caches (every op's tensors come from
memory). It is counted from the same recording as the FLOPs, on meta or fake tensors too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator, Optional, Union

import torch
from torch import nn

from ..engine.counting import Statistics, run_handle, statistics_of
from .devices import DeviceSpec, device_spec, dtype_key
from ..frontends.program_source import ProgramSource
from ..handles import FLOP_FORMULAS, Handle, ShapeFormula
from ..handles.convolution import CUDNN_TF32_KINDS
from ..handles.traffic import BYTES_FORMULAS, METADATA_OPS, TrafficFormulas
from ..engine.jit_analysis import JitModelAnalysis
from ..core.op_source import OpSource
from ..core.records import OpRecord, TensorMeta

DeviceLike = Union[str, DeviceSpec, Mapping[str, Any]]


def roofline_seconds(flops: float, traffic: float, peak: float, spec: DeviceSpec, dtype: str = "float32") -> float:
    """One kernel's time: the slower of its compute and its memory traffic, plus its launch;
    ``dtype``: the key of the peak and of the compute curve (:func:`~jitflops.estimates.devices.dtype_key`)."""
    if not flops and not traffic:
        return 0.0
    return max(flops / (spec.compute_share(flops, dtype) * peak), traffic / (spec.memory_efficiency * spec.memory_bandwidth)) + spec.launch_s


def tf32_allowed(kind: str) -> bool:
    """Whether a float32 op of ``kind`` may run on TF32 tensor cores: cuDNN's switch for the
    convolutions, the matmul switch for everything else (torch's defaults: on and off)."""
    return torch.backends.cudnn.allow_tf32 if kind in CUDNN_TF32_KINDS else torch.backends.cuda.matmul.allow_tf32


def compute_dtype(op: OpRecord) -> Optional[torch.dtype]:
    """The dtype an op computes in: its first floating-point (else first) tensor input's."""
    tensors = [value for value in op.inputs if isinstance(value, TensorMeta) and value.dtype is not None]
    floating = [value.dtype for value in tensors if value.dtype.is_floating_point]
    return floating[0] if floating else (tensors[0].dtype if tensors else None)


class RooflineFormulas(Mapping[str, Handle]):
    """Every op's predicted seconds on ``spec``, from its FLOP formula (if any) and its traffic."""

    def __init__(self, spec: DeviceSpec, flop_handles: Mapping[str, Handle], traffic: TrafficFormulas) -> None:
        self._spec, self._flops, self._traffic = spec, flop_handles, traffic
        self._formula = ShapeFormula(self.seconds)

    def seconds(self, op: OpRecord) -> float:
        flop_handle = self._flops.get(op.kind)
        flops = 2 * sum(run_handle(flop_handle, op).values()) if flop_handle is not None else 0
        byte_handle = self._traffic.get(op.kind)
        traffic = sum(run_handle(byte_handle, op).values()) if byte_handle is not None else 0
        dtype, tf32 = compute_dtype(op), tf32_allowed(op.kind)
        return roofline_seconds(float(flops), float(traffic), self._spec.peak_for(dtype, tf32), self._spec, dtype_key(dtype, tf32))

    def __getitem__(self, kind: str) -> Handle:
        if self._traffic.get(kind) is None and kind not in self._flops:
            raise KeyError(kind)
        return self._formula

    def __iter__(self) -> Iterator[str]:
        return iter(self._flops)

    def __len__(self) -> int:
        return len(self._flops)


class PredictedTimeAnalysis(JitModelAnalysis):
    """Predicted seconds per module and per operator on ``device`` (a name of the device table,
    ``"h100"``, a spec file from ``jitflops calibrate``, or a :class:`~jitflops.estimates.devices.DeviceSpec`),
    in fvcore's shape: ``total()`` is the forward's (and, with ``backward=True`` under the dispatch
    backend, the backward's) predicted time.

    >>> PredictedTimeAnalysis(model, inputs, device="h100").by_module()
    """

    def __init__(self, model: Union[nn.Module, ProgramSource], inputs: Any = None, kwargs: Optional[Mapping[str, Any]] = None, *, device: DeviceLike = "h100",
                 **front_end: Any) -> None:
        self._spec = device_spec(device)
        super().__init__(model, inputs, kwargs, **front_end)

    @property
    def device(self) -> DeviceSpec:
        return self._spec

    @classmethod
    def _default_ignored_ops(cls) -> frozenset[str]:
        return METADATA_OPS

    def _new_like(self, model: nn.Module, inputs: Any, kwargs: Optional[Mapping[str, Any]]) -> "PredictedTimeAnalysis":
        return type(self)(model, inputs, kwargs, device=self._spec, **self._front_end_settings())

    def _analyze(self, trace: OpSource) -> Statistics:
        traffic = TrafficFormulas({**BYTES_FORMULAS.handles(), **self._op_handles}, self._ignored_ops)
        return statistics_of(trace, RooflineFormulas(self._spec, FLOP_FORMULAS.handles(), traffic), self._ignored_ops, self._aliases, self._ancestor_mode)
