"""Gathers' kernels (an embedding's rows, ``index_select``, ``gather``, advanced indexing), on the
spec's curve by the elements they write; an embedding's backward, on the copy curve by its
gradient's elements (a table-sized tensor written whole, zeros and the rows added: BERT-base's 23 M
elements took 21 ms and GPT-2's 39 M 32 ms in a training step on a 2-core AVX-512 EPYC, priced
28 and 47 ms where the gather curve had priced them by the rows at 2 ms)."""

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


@KERNEL_COSTS.register("aten::embedding_dense_backward")
def embedding_backward_seconds(op: OpRecord, spec: DeviceSpec, flops: float, traffic: float) -> Optional[float]:
    curve = curve_of(spec, "copy")
    return curve_seconds(curve, output_elements(op)) if curve is not None else None
