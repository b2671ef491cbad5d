"""Gathers' kernels (an embedding's rows, ``index_select``, ``gather``, advanced indexing), on the
spec's curve by the elements they write."""

from __future__ import annotations

from typing import Optional

from ...core.records import OpRecord
from ...handles.zero_cost import aten_kinds
from ..devices import DeviceSpec
from ..measured_curves import curve_seconds
from .operands import output_elements
from .registry import KERNEL_COSTS, curve_of

GATHERS = aten_kinds("embedding index_select gather index take embedding_bag _embedding_bag _embedding_bag_forward_only")


@KERNEL_COSTS.register(*sorted(GATHERS))
def gather_seconds(op: OpRecord, spec: DeviceSpec, flops: float, traffic: float) -> Optional[float]:
    curve = curve_of(spec, "gather")
    return curve_seconds(curve, output_elements(op)) if curve is not None else None
