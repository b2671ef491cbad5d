"""The time of each op's kernel on a device, op family by op family (one module each): products,
convolutions, attention, elementwise ops, reductions and norms, gathers. Each reads the curve a
calibration measured for its family (:mod:`jitflops.timing.calibration`), or gives None where the
spec has none, and the roofline prices the op (:func:`kernel_seconds`). A copy an op makes only to
change a tensor's layout is added to it (:mod:`.layout`)."""

from __future__ import annotations

from ...core.records import OpRecord
from ..devices import DeviceSpec, dtype_key
from . import attention, convolution, elementwise, gathers, products, reductions  # noqa: F401  (each registers its family)
from .layout import layout_copy_seconds
from .operands import compute_dtype
from .registry import KERNEL_COSTS, roofline_seconds

FUSED_WHEN_COMPILED = elementwise.ELEMENTWISE_KINDS | reductions.REDUCTION_KINDS
"""The ops ``torch.compile`` (inductor) writes its own loops for, fusing each run of them into one kernel."""


def kernel_seconds(op: OpRecord, spec: DeviceSpec, flops: float, traffic: float, tf32: bool = False) -> float:
    """Seconds of ``op``'s kernel on ``spec``: its family's curve, else the roofline, and the copy
    it makes to change a tensor's layout. Nothing moved and nothing computed (a view, a size) takes
    no kernel."""
    layout = layout_copy_seconds(op, spec)
    if not flops and not traffic:
        return layout
    cost = KERNEL_COSTS.get(op.kind)
    seconds = cost(op, spec, flops, traffic) if cost is not None else None
    if seconds is None:
        dtype = compute_dtype(op)
        seconds = roofline_seconds(flops, traffic, spec.peak_for(dtype, tf32), spec, dtype_key(dtype, tf32))
    return seconds + layout


__all__ = ["FUSED_WHEN_COMPILED", "KERNEL_COSTS", "compute_dtype", "kernel_seconds", "roofline_seconds"]
