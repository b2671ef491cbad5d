"""Convolutions' kernels: a 1 x 1 convolution of stride 1 is a product of the positions by the
channels' matrix, read from the spec's grid of such convolutions where it has one (a channels-first
image's convolution runs oneDNN's kernel, not the product: MobileNetV2's 16 to 96 channels over
112 x 112 positions take 0.33 ms, their product 0.26), or from its grid of torch's own kernel where
torch runs that one (:func:`runs_natively`), else from the product grid; a dense 3 x 3
one from the spec's grid of those by its output's positions and weight size where it has one and
its weight is no smaller than the grid's smallest (at the same FLOPs, 512 channels over 7 x 7
positions take twice as long as 64 over 56 x 56, and ResNet-50's last stage's first one, of stride
2, as long as those of stride 1 after it; a stem's 3 input channels run a kernel of their own, on
the dense curve); a grouped one
(a few input channels to each filter) from the spec's grid by the reduction of an output and
FLOPs where it has one; a depthwise one (a filter per channel) and any other have curves of their
own by FLOPs, a depthwise one of 5 x 5 taps or more the curve of 7 x 7 ones where the spec has it."""

from __future__ import annotations

import math
from typing import Optional

from ...core.records import OpRecord, TensorMeta
from ..devices import DeviceSpec, dtype_key
from ..measured_curves import curve_seconds
from .operands import compute_dtype
from .products import product_seconds
from .registry import KERNEL_COSTS, curve_of


NATIVE_MOST_ELEMENTS = 20480
"""The most elements of a float32 image of one sample whose 1 x 1 convolution of stride 1 torch
runs with its own kernel (``_slow_conv2d_forward``: a GEMM) instead of oneDNN's on a CPU with
more than one thread (``ConvParams::use_mkldnn`` in ``aten/src/ATen/native/Convolution.cpp``:
"for some case, native is faster")."""

SINGLE_THREAD_MOST_IMAGES = 15
"""The most images of a float32 1 x 1 convolution of stride 1 torch runs with its own kernel, whatever
their size, where it has one intra-op thread (``ConvParams::use_mkldnn``: "For 1x1 filters, MKLDNN
is faster than THNN when multi-threaded, but THNN is faster when single-threaded")."""

WIDE_DEPTHWISE_FROM_TAPS = 21
"""The fewest taps of a depthwise convolution read on the spec's curve of 7 x 7 ones: those nearer
49 than 9 on a log scale (5 x 5 and up; a 1-D one of 21 taps or more)."""

CONVOLUTION_KINDS = ("aten::_convolution", "aten::convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::mkldnn_convolution")


def runs_natively(x: TensorMeta, dtype: str, threads: Optional[int] = None) -> bool:
    """Whether torch runs a 1 x 1 convolution of stride 1 of ``x`` on a CPU of ``threads`` intra-op
    threads (None: more than one) with its own kernel: a float32 image of one sample of at most
    :data:`NATIVE_MOST_ELEMENTS`, or with one thread, any float32 batch of at most
    :data:`SINGLE_THREAD_MOST_IMAGES`. On the 2-core EPYC, MobileNetV2's 64 to 384 channels over 14
    x 14 positions (12,544 elements in) took 97 us that way, and the reverse, 384 to 64 (75,264 in,
    oneDNN's), 178 us; six such pairs ran 1.7 to 1.9 times as long reduced as expanded, where pairs
    both on oneDNN ran within 10%. A 1-D convolution runs as a 2-D one of height 1, by the same rule;
    a 3-D one has kernels of its own."""
    if dtype != "float32" or len(x.shape) not in (3, 4):
        return False
    return (x.shape[0] == 1 and x.numel <= NATIVE_MOST_ELEMENTS) or (threads == 1 and x.shape[0] <= SINGLE_THREAD_MOST_IMAGES)


@KERNEL_COSTS.register(*CONVOLUTION_KINDS)
def convolution_seconds(op: OpRecord, spec: DeviceSpec, flops: float, traffic: float) -> Optional[float]:
    x, w = op.input(0), op.input(1)
    if not isinstance(x, TensorMeta) or not isinstance(w, TensorMeta) or not w.shape or not x.shape or flops <= 0:
        return None
    dtype = dtype_key(compute_dtype(op))
    groups = op.arg_or("groups", 1)
    stride = op.arg_or("stride", [1])
    transposed = op.arg_or("transposed", False)
    if not transposed and groups == 1 and all(size == 1 for size in w.shape[2:]) and all(step == 1 for step in stride):
        positions, weight = x.numel / w.shape[1], math.prod(w.shape[:2])
        native = spec.native_pointwise_products.get(dtype) if runs_natively(x, dtype, spec.threads) else None
        grid = native if native is not None else spec.pointwise_products.get(dtype)
        return flops / grid.rate(positions, weight) if grid is not None else product_seconds(spec, dtype, positions, weight, flops)
    three_by_three, weight = spec.three_by_three_convolutions.get(dtype), math.prod(w.shape)
    if three_by_three is not None and not transposed and groups == 1 and tuple(w.shape[2:]) == (3, 3) and weight >= three_by_three.weights[0]:
        return flops / three_by_three.rate(flops / (2 * weight), weight)  # at its output's positions, whatever its stride
    grouped = spec.grouped_convolutions.get(dtype) if groups > 1 and w.shape[1] > 1 and not transposed else None
    if grouped is not None:
        return flops / grouped.rate(math.prod(w.shape[1:]), flops)
    family = "depthwise_convolution" if groups > 1 and w.shape[1] == 1 else "convolution"
    wide = curve_of(spec, "wide_depthwise_convolution", dtype) if family == "depthwise_convolution" and math.prod(w.shape[2:]) >= WIDE_DEPTHWISE_FROM_TAPS else None
    curve = wide or curve_of(spec, family, dtype)
    return curve_seconds(curve, flops) if curve is not None else None
