"""Integer products: quantized layers and int8/int4 matrix products, counted as integer
multiply-accumulates (IOPs), apart from floating-point MACs.

A quantized model's arithmetic is integer work: a dynamically quantized ``Linear``
(``quantized::linear_dynamic``) multiplies int8 weights by activations quantized on the fly,
``_int_mm`` multiplies int8 matrices, and the weight-only kernels (``_weight_int8pack_mm``,
``_weight_int4pack_mm``) read int8/int4 weights. These ops cost zero FLOPs in a FLOP count (they
are known ops, never "unsupported") and their multiply-accumulates are counted here, by the same
rules as the float products they replace (``IntegerOpCountAnalysis``). A quantized op's packed
weights are recorded as the weight tensor they hold (its shape).
"""

from __future__ import annotations

from ..core.records import OpRecord
from .convolution import conv_macs
from .registry import FormulaTable
from .shapes import prod

INTEGER_MAC_FORMULAS = FormulaTable("integer MAC formulas")
"""Quantized and integer products, each counted as its integer multiply-accumulates."""


@INTEGER_MAC_FORMULAS.register(
    "quantized::linear_dynamic", "quantized::linear_relu_dynamic", "quantized::linear", "quantized::linear_relu",
    key="linear",
)
def quantized_linear_macs(op: OpRecord) -> int:
    """Every input row times the packed ``out x in`` weight."""
    out_features, in_features = op.input_shape(1)
    return prod(op.input_shape(0)) // in_features * in_features * out_features


@INTEGER_MAC_FORMULAS.register(
    "quantized::conv1d", "quantized::conv2d", "quantized::conv2d_relu", "quantized::conv3d", "quantized::conv3d_relu",
    key="conv",
)
def quantized_conv_macs(op: OpRecord) -> int:
    return conv_macs(op.input_shape(0), op.input_shape(1), op.output_shape(), transposed=False)


@INTEGER_MAC_FORMULAS.register("aten::_int_mm", key="int_mm")
def int_mm_macs(op: OpRecord) -> int:
    (m, k), (_, n) = op.input_shape(0), op.input_shape(1)
    return m * k * n


@INTEGER_MAC_FORMULAS.register("aten::_weight_int8pack_mm", key="weight_int8pack_mm")
def weight_int8pack_mm_macs(op: OpRecord) -> int:
    """Activations ``m x k`` times int8 weights ``n x k``."""
    activations, weights = op.input_shape(0), op.input_shape(1)
    return prod(activations) * weights[0]


@INTEGER_MAC_FORMULAS.register("aten::_weight_int4pack_mm", "aten::_weight_int4pack_mm_for_cpu", key="weight_int4pack_mm")
def weight_int4pack_mm_macs(op: OpRecord) -> int:
    """Activations ``m x k`` times int4 weights packed ``n x k``: ``n`` read from the scales and
    zero points (``k / group size x n x 2``), the packed layout depending on the kernel."""
    activations, scales = op.input_shape(0), op.input_shape(3)
    return prod(activations) * scales[1]
