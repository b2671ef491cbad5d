"""Fused attention's kernel: ``scaled_dot_product_attention`` on its curve by FLOPs (counted densely),
the causal curve where it runs causally (its kernel skips the blocks above the diagonal), the
masked one where it is given a mask (which it reads and adds), the decode curve where one query
attends (a decode step's: bound by reading the cache, mask or not)."""

from __future__ import annotations

from typing import Optional

from ...core.records import OpRecord, TensorMeta
from ..devices import DeviceSpec, dtype_key
from ..measured_curves import curve_seconds
from .operands import compute_dtype
from .registry import KERNEL_COSTS, curve_of

ATTENTION_KERNELS = (
    "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
)


@KERNEL_COSTS.register(*ATTENTION_KERNELS)
def attention_seconds(op: OpRecord, spec: DeviceSpec, flops: float, traffic: float) -> Optional[float]:
    query = op.input(0)
    dtype = dtype_key(compute_dtype(op))
    decode = curve_of(spec, "decode_attention", dtype) if isinstance(query, TensorMeta) and query.shape and len(query.shape) >= 2 and query.shape[-2] == 1 else None
    family = "causal_attention" if op.arg_or("is_causal", False) else "masked_attention" if isinstance(op.arg_or("attn_mask", None), TensorMeta) else "attention"
    curve = decode or curve_of(spec, family, dtype)
    return curve_seconds(curve, flops) if curve is not None and flops > 0 else None
