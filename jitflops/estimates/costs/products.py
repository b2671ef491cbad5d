"""Matrix products' kernels: a product of M rows by a K x N weight at the rate the spec's product
grid gives for M and K x N, times the rate its shape reaches against a square weight's (the spec's
aspects, by K over N), and where it adds a bias, the copy of the bias into its output that
comes first (``addmm``'s); a batched product (attention's, ``bmm``) on its batched curve by FLOPs; a
grouped product of experts (``_grouped_mm``) as its groups' mean rows by one expert's weight."""

from __future__ import annotations

import math
from typing import Optional

from ...core.records import OpRecord, TensorMeta
from ..devices import DeviceSpec, dtype_key
from ..measured_curves import curve_seconds
from .registry import KERNEL_COSTS, curve_of
from .operands import compute_dtype


def product_seconds(spec: DeviceSpec, dtype: str, rows: float, weight: float, flops: float, inner: Optional[float] = None) -> Optional[float]:
    """``flops`` of ``rows`` rows by a weight of ``weight`` elements, at the grid's rate (None: no
    grid), and by the weight's shape where ``inner`` (its K) is given and the spec has its aspects."""
    grid = spec.products.get(dtype) or spec.products.get("float32")
    if grid is None or flops <= 0:
        return None
    rows, weight = max(rows, 1.0), max(weight, 1.0)
    return flops / (grid.rate(rows, weight) * aspect_factor(spec, dtype, rows, weight, inner))


def aspect_factor(spec: DeviceSpec, dtype: str, rows: float, weight: float, inner: Optional[float]) -> float:
    """A weight of K = ``inner`` by N = ``weight`` / K: its product's rate against a square weight's
    of its size, read from the spec's aspects (1: none, or no K) at the same K over N; one that
    widens more than the aspects' narrowest K (a CPU's: the square one) at that K's rate; one that
    narrows (K over N) at no less than the square one's.

    A narrowing weight ran 1.0 to 1.25 times the square one's rate by rows in every quiet
    calibration of the 2-core EPYCs, and faster still in a model (ConvNeXt-T's 1,536 x 384 over
    196 rows at 180-190 GFLOP/s, 2026-12-08). A reading below it is a slow stretch over a cell timed
    once or twice (the aspects get 3% of the budget): 0.71, then 0.55 and 0.61 times, in two
    calibrations, which priced ConvNeXt-T's narrowing layers at up to 2.2 times their time."""
    aspects = spec.product_aspects.get(dtype) or spec.product_aspects.get("float32")
    if aspects is None or not inner:
        return 1.0
    square = aspects.weights[-1] / 2  # K = N: half the widest K, twice the width, whether the aspects time half the width or not
    factor = aspects.rate(rows, inner * square / math.sqrt(weight)) / aspects.rate(rows, square)
    return max(factor, 1.0) if inner * inner > weight else factor


def _with_bias(spec: DeviceSpec, seconds: Optional[float], bias: object, output_elements: float) -> Optional[float]:
    """A product's time with the copy of its bias into its output, where it has a bias."""
    copy = curve_of(spec, "copy")
    if seconds is None or not isinstance(bias, TensorMeta) or copy is None:
        return seconds
    return seconds + curve_seconds(copy, output_elements)


def _batched(spec: DeviceSpec, dtype: str, flops: float) -> Optional[float]:
    curve = curve_of(spec, "bmm", dtype)
    return curve_seconds(curve, flops) if curve is not None and flops > 0 else None


MATRIX_PRODUCTS = ("aten::addmm", "aten::mm", "aten::matmul", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::einsum")

PRODUCT_KINDS = frozenset(("aten::linear", "aten::_grouped_mm", *MATRIX_PRODUCTS))
"""Every product this module prices."""


@KERNEL_COSTS.register("aten::linear")
def linear_seconds(op: OpRecord, spec: DeviceSpec, flops: float, traffic: float) -> Optional[float]:
    x, w = op.input(0), op.input(1)
    if not isinstance(x, TensorMeta) or not isinstance(w, TensorMeta) or not w.shape:
        return None
    rows = x.numel / max(w.shape[-1], 1)
    seconds = product_seconds(spec, dtype_key(compute_dtype(op)), rows, math.prod(w.shape), flops, inner=w.shape[-1])
    return _with_bias(spec, seconds, op.input(2), rows * w.shape[0])


@KERNEL_COSTS.register(*MATRIX_PRODUCTS)
def matrix_product_seconds(op: OpRecord, spec: DeviceSpec, flops: float, traffic: float) -> Optional[float]:
    """A product whose second operand is a matrix (a weight): the grid; a batched one: its curve."""
    dtype = dtype_key(compute_dtype(op))
    matrices = [value for value in op.inputs if isinstance(value, TensorMeta) and value.shape is not None and len(value.shape) >= 2]
    if op.kind in ("aten::addmm", "aten::mm", "aten::matmul") and len(matrices) >= 2 and len(matrices[-1].shape) == 2:
        a, b = matrices[-2], matrices[-1]
        rows = a.numel / max(a.shape[-1], 1)
        seconds = product_seconds(spec, dtype, rows, math.prod(b.shape), flops, inner=b.shape[0])
        return _with_bias(spec, seconds, op.input(0) if op.kind == "aten::addmm" else None, rows * b.shape[-1])
    return _batched(spec, dtype, flops)


@KERNEL_COSTS.register("aten::_grouped_mm")
def grouped_product_seconds(op: OpRecord, spec: DeviceSpec, flops: float, traffic: float) -> Optional[float]:
    a, b = op.input(0), op.input(1)
    if not isinstance(a, TensorMeta) or not isinstance(b, TensorMeta) or len(b.shape or ()) != 3:
        return None
    groups = b.shape[0]
    return product_seconds(spec, dtype_key(compute_dtype(op)), a.shape[0] / groups, b.shape[1] * b.shape[2], flops, inner=b.shape[1])
