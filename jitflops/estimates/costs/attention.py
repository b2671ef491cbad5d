"""Fused attention's kernel: ``scaled_dot_product_attention`` on its curve by FLOPs (counted densely),
the causal curve where it runs causally (its kernel skips the blocks above the diagonal), the
masked one where it is given a mask (which it reads and adds), the decode curve where one query or
a few attend (a decode step's: bound by reading the cache, mask or not).

On a CPU, attention that drops out (training's ``dropout_p > 0``) does not run fused: torch's CPU
kernel has no dropout, and SDPA takes its math path. Its forward, recorded whole, is then two
batched products, a softmax over the scores, the dropout's draw of a mask and its multiply
(:func:`math_path_seconds`); its backward is recorded as the math path's own ops, which a recording
runs where the CPU would (:mod:`jitflops.frontends.dispatch_trace`)."""

from __future__ import annotations

from typing import Optional

from ...core.records import OpRecord, TensorMeta
from ...handles.attention import attention_shape
from ..devices import DeviceSpec, dtype_key, is_cpu_spec
from ..measured_curves import curve_seconds
from .operands import compute_dtype
from .registry import KERNEL_COSTS, curve_of

DECODE_QUERIES = 8
"""The most query positions priced as a decode step's read of the cache (the decode curve, at one
query's FLOPs): transformers folds a grouped-query decode step's query heads into positions when
it passes a mask (Llama GQA's 8 heads over 2 key heads: 4 queries). On the 2-core EPYC, 4 queries
over 132 keys took 1.2-1.7 times one, 16 up to 3.7 times; on the masked curve, whose first point is
12.6 MFLOPs' 108 us, Llama GQA's two took 257 us a decode step against 14 measured."""

ATTENTION_KERNELS = (
    "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
)


def math_path_seconds(op: OpRecord, spec: DeviceSpec) -> Optional[float]:
    """SDPA's math path's forward on ``spec``'s curves (None: a curve it needs is missing)."""
    pairs, head_dim, value_dim = attention_shape(op)
    dtype = dtype_key(compute_dtype(op))
    curves = [curve_of(spec, "bmm", dtype), curve_of(spec, "softmax"), curve_of(spec, "random"), curve_of(spec, "arithmetic")]
    if any(curve is None for curve in curves):
        return None
    products, softmax, random, arithmetic = curves
    scores, values = 2.0 * pairs * head_dim, 2.0 * pairs * value_dim  # the FLOPs of the product that makes the scores, and of the one that weighs the values
    return curve_seconds(products, scores) + curve_seconds(products, values) + curve_seconds(softmax, pairs) + curve_seconds(random, pairs) + curve_seconds(arithmetic, pairs)


@KERNEL_COSTS.register(*ATTENTION_KERNELS)
def attention_seconds(op: OpRecord, spec: DeviceSpec, flops: float, traffic: float) -> Optional[float]:
    math_path = math_path_seconds(op, spec) if is_cpu_spec(spec) and (op.arg_or("dropout_p", 0.0) or 0.0) > 0 else None
    if math_path is not None:
        return math_path
    query = op.input(0)
    dtype = dtype_key(compute_dtype(op))
    queries = query.shape[-2] if isinstance(query, TensorMeta) and len(query.shape) >= 2 else None
    decode = curve_of(spec, "decode_attention", dtype) if queries is not None and queries <= DECODE_QUERIES else None
    if decode is not None:  # a read of the cache, once for its few queries
        return curve_seconds(decode, flops / queries) if flops > 0 else None
    family = "causal_attention" if op.arg_or("is_causal", False) else "masked_attention" if isinstance(op.arg_or("attn_mask", None), TensorMeta) else "attention"
    curve = curve_of(spec, family, dtype)
    return curve_seconds(curve, flops) if curve is not None and flops > 0 else None
