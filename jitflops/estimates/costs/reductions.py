"""Kernels that reduce along rows or windows, on the spec's curves by the elements they read: norms
(layer, group, RMS, a batch norm in training: read twice), a batch norm in eval mode (a scale and a
shift per channel), softmax (three passes), windowed pools, reductions that return an index
(``argmax``, ``max`` along a dimension), and sums, means, maxima and global pools."""

from __future__ import annotations

from typing import Optional

from ...core.records import OpRecord
from ...handles.elementwise import REDUCTION_OPS, SOFTMAX_OPS
from ...handles.zero_cost import aten_kinds
from ..devices import DeviceSpec
from ..measured_curves import curve_seconds
from .operands import input_elements
from .registry import KERNEL_COSTS, curve_of

NORMS = aten_kinds(
    "batch_norm native_batch_norm _native_batch_norm_legit _native_batch_norm_legit_no_training _batch_norm_no_update cudnn_batch_norm "
    "miopen_batch_norm group_norm layer_norm instance_norm native_group_norm native_layer_norm rms_norm _fused_rms_norm "
    "native_batch_norm_backward batch_norm_backward native_layer_norm_backward native_group_norm_backward _fused_rms_norm_backward"
)
GLOBAL_POOLS = aten_kinds(
    "adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d _adaptive_avg_pool2d _adaptive_avg_pool3d adaptive_max_pool1d "
    "adaptive_max_pool2d adaptive_max_pool3d"
)
"""Pools to a fixed output size: a model's last pool is a mean over each channel, a reduction."""
WINDOWED_POOLS = aten_kinds("avg_pool1d avg_pool2d avg_pool3d max_pool1d max_pool2d max_pool3d max_pool1d_with_indices max_pool2d_with_indices max_pool3d_with_indices")
INDEX_REDUCTIONS = aten_kinds("argmax argmin max min")
"""Reductions that return where their extreme is (``max`` and ``min`` along a dimension; without
one they return the value alone, a plain reduction)."""
BATCH_NORMS = aten_kinds("batch_norm native_batch_norm _native_batch_norm_legit _native_batch_norm_legit_no_training _batch_norm_no_update cudnn_batch_norm miopen_batch_norm")


def _family(op: OpRecord) -> str:
    if op.kind in BATCH_NORMS and (op.kind == "aten::_native_batch_norm_legit_no_training" or not op.arg_or("training", False)):
        return "batch_norm"
    if op.kind in NORMS:
        return "norm"
    if op.kind in WINDOWED_POOLS:
        return "pool"
    if op.kind in INDEX_REDUCTIONS and (op.kind in ("aten::argmax", "aten::argmin") or op.arg_or("dim", None) is not None):
        return "index_reduction"
    return "softmax" if op.kind in SOFTMAX_OPS else "reduction"


REDUCTION_KINDS = frozenset(NORMS | set(SOFTMAX_OPS) | set(REDUCTION_OPS) | GLOBAL_POOLS | WINDOWED_POOLS)


@KERNEL_COSTS.register(*sorted(REDUCTION_KINDS))
def reduction_seconds(op: OpRecord, spec: DeviceSpec, flops: float, traffic: float) -> Optional[float]:
    curve = curve_of(spec, _family(op))
    return curve_seconds(curve, input_elements(op)) if curve is not None else None
