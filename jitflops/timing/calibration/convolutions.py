"""Convolutions: dense ones and depthwise ones, each a curve of time by FLOPs, 1 x 1 ones and dense
3 x 3 ones of stride 1 on grids by positions and weight size, and grouped ones on a grid by the width of a group and FLOPs.

A 1 x 1 convolution is a product over the positions, but on a channels-first image oneDNN runs it
as a convolution, converting the layout: with few channels it runs far below the product of its
shape (16 to 96 channels over 112 x 112 positions: 0.33 ms against 0.26; 24 to 144 over 56 x 56:
0.25 against 0.15), with many near it. So it gets a grid of its own, like the products', of
expansions by 4 from 16 to 1,024 input channels over 1 x 1 to 112 x 112 positions, each on oneDNN's
kernel; the float32 ones torch runs with its own kernel (an image of at most 20,480 elements: a
GEMM) get a grid of that kernel. A dense
convolution with a larger kernel, and a depthwise one (a filter per channel: MobileNets, ConvNeXt),
run kernels of their own at rates of their own; each is timed on the layers of a ResNet and of a
MobileNetV2 at 224 x 224, batch 1. A grouped convolution (ResNeXt's, RegNet's: a few input
channels to each filter) runs at the rate of the reduction each output sums over, its group's
input channels times the kernel's area, more than by its FLOPs: at 29 MFLOPs on the 2-core EPYC,
4 channels a group ran at 69 GFLOP/s, 16 at 146, 64 at 200, where the dense curve gave all 70.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from ...core.records import TensorMeta
from ...estimates.costs.convolution import runs_natively
from ...estimates.measured_curves import ProductGrid
from .budget import Budget, CallTimer, Maker, OnActivations, interleaved_medians, measured_curve
from .products import measured_grid

DENSE = ((16, 16, 28, 3, 1), (3, 32, 224, 3, 2), (32, 32, 56, 3, 1), (3, 64, 224, 7, 2), (64, 64, 56, 3, 1), (256, 256, 14, 3, 1),
         (128, 128, 56, 3, 1), (256, 256, 28, 3, 1))
"""(in channels, out channels, size, kernel, stride) of dense convolutions from 4 to 900 MFLOPs: a
MobileNet's stem, ResNet-50's stem and 3 x 3 layers, and larger."""
DEPTHWISE = ((32, 112, 3, 1), (96, 112, 3, 2), (144, 56, 3, 1), (192, 28, 3, 1), (384, 14, 3, 1), (576, 14, 3, 1), (960, 7, 3, 1))
"""(channels, size, kernel, stride) of 3 x 3 depthwise convolutions: MobileNetV2's."""
WIDE_DEPTHWISE = ((512, 7, 7, 1), (256, 14, 7, 1), (128, 28, 7, 1), (64, 56, 7, 1), (96, 56, 7, 1))
"""(channels, size, kernel, stride) of 7 x 7 depthwise convolutions: a CNN's four stages, from 64
channels over 56 x 56 positions to 512 over 7 x 7. Their FLOPs do not set their time apart from a
3 x 3 one's: each output takes 49 products of a tap where a 3 x 3 takes 9, for the same reads and
writes. On a 2-core AVX-512 EPYC (2026-12-08), 384 channels over 14 x 14 by 7 x 7 (7.4 MFLOPs, a
ConvNeXt-T stage's) took 0.11 ms, and 32 channels over 112 x 112 by 3 x 3 (7.2 MFLOPs) 0.20 to
0.92 ms in three calibrations; priced on one curve with the 3 x 3 ones until then, ConvNeXt-T's
were priced at 2 to 3 times their time (by stage), its forward 13% to 22% over in 3 rounds."""


POINTWISE_SIZES = (1, 7, 14, 28, 56, 112)
"""Sides of the square images of the 1 x 1 grid: 1 to 12,544 positions. One position is a
squeeze-and-excitation's (RegNetY's, EfficientNet's, MobileNetV3's), on the pooled image: the call, not
the product, sets its time (RegNetY's took 40 to 50 µs, where the grid's rate at 49 positions gave
4; at one image torch runs it with its own kernel, :func:`native_pointwise_grid`)."""
POINTWISE_CHANNELS = (16, 32, 64, 128, 256, 512, 1024)
"""Input channels of the 1 x 1 grid, each expanded by 4: weights of 1 Ki to 4 Mi elements, as wide
as ResNet-50's last stage (512 to 2,048 channels) and EfficientNet's. Before 2026-11-29 the widest
was 256 to 1,024, at whose rate every wider one was read: 129 GFLOP/s at 7 x 7 positions, where
EfficientNet's 3,840 to 640 channels ran at 243 (991 µs a call, priced at 1,865)."""
NATIVE_POINTWISE_CHANNELS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024)
"""Input channels of the grid of torch's own 1 x 1 kernel, each expanded by 4: by halves of an
octave, as its images of at most 20,480 elements leave a few channels to each side (up to 96 at 14
x 14, 384 at 7 x 7), and its rate changes fast with them (MobileNetV2's 64 to 384 channels over 14 x
14 positions ran at 100 GFLOP/s, 64 to 256 at 60)."""
POINTWISE_MOST_FLOPS = 2e9
"""1 x 1 convolutions above this many FLOPs are not timed: the grid takes the rate of the largest timed one of their row."""

POINTWISE_RESIDENT_RERUNS = 1
"""Untimed calls of a 1 x 1 convolution of the resident grid (what a model whose weights fit the
last-level cache runs) just before its timed one: its weights, oneDNN's buffers and its output's
memory where the forward before left them. Timed among the other sizes of the grid, whose largest
write 26 MB, those had left the caches: on the 2-core EPYC MobileNetV2's 32 to 192 channels over
28 x 28 positions took 154 us a call in the grid, 60 us in a loop and 86 to 99 us in the model's
forward (``profile_model``), and its 1 x 1 convolutions over 28 x 28 and 14 x 14 were priced 23% to
98% over their time; after one call of its own, 96 us."""

THREE_BY_THREE_SIZES = (7, 14, 28, 56, 112)
"""Sides of the square images of the 3 x 3 grid: ResNet's stages, 49 to 12,544 positions."""
THREE_BY_THREE_CHANNELS = (32, 64, 128, 256, 512)
"""Channels in and out of the 3 x 3 grid: weights of 9 Ki to 2.25 Mi elements, ResNet-18's and
ResNet-50's 64 to 512."""
THREE_BY_THREE_MOST_FLOPS = 1e9
"""3 x 3 convolutions above this many FLOPs are not timed: the grid takes the rate of the largest timed one of their row."""

GROUP_WIDTHS = (4, 8, 16, 64, 128)
"""Input channels per group of the grouped grid (3 x 3 kernels: reductions of 36 to 1,152): ResNeXt's
4 to 32, RegNetX's 8 to 24, RegNetY's 64, and wider."""
GROUPED_FLOPS = (2_000_000, 8_000_000, 32_000_000, 128_000_000)
"""FLOPs of the grouped grid's columns: a small RegNet's 7 x 7 layers to ResNeXt-50's and RegNetY's largest."""


def _groups_of(width: int) -> int:
    """The groups a grouped convolution of ``width`` channels a group has in the grid: 32 of a few
    channels (ResNeXt's cardinality), 256 channels in all of wide ones."""
    return 32 if width <= 16 else max(256 // width, 2)


Convolve = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""A 1 x 1 convolution of stride 1 by one of torch's CPU kernels."""


def _one_dnn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.mkldnn_convolution(x, w, None, [0, 0], [1, 1], [1, 1], 1)


def _native(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._slow_conv2d_forward(x, w, [1, 1], None, [1, 1], [0, 0])


def _convolution(device: torch.device, dtype: torch.dtype, inputs: int, outputs: int, size: int, kernel: int, stride: int, groups: int,
                 convolve: Optional[Convolve] = None) -> tuple[float, Maker]:
    """A convolution's FLOPs and the maker of its call: ``F.conv2d``, where torch picks the kernel, unless ``convolve`` is given."""
    out = (size + 2 * (kernel // 2) - kernel) // stride + 1

    def make() -> Callable[[], object]:
        x = torch.randn(1, inputs, size, size, device=device).to(dtype)
        w = torch.randn(outputs, inputs // groups, kernel, kernel, device=device).to(dtype)
        if convolve is not None:
            return OnActivations(lambda: convolve(x, w), x)
        return OnActivations(lambda: F.conv2d(x, w, stride=stride, padding=kernel // 2, groups=groups), x)
    return 2.0 * outputs * out * out * inputs // groups * kernel * kernel, make


def _dense(device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int, int, int]) -> tuple[float, Maker]:
    inputs, outputs, size, kernel, stride = shape
    return _convolution(device, dtype, inputs, outputs, size, kernel, stride, 1)


def _depthwise(device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int, int]) -> tuple[float, Maker]:
    channels, size, kernel, stride = shape
    return _convolution(device, dtype, channels, channels, size, kernel, stride, channels)


def convolution_curves(cold: CallTimer, produced: CallTimer, dtype: torch.dtype, budget: Budget, host_s: float) -> dict[str, tuple[tuple[float, float], ...]]:
    """The dense curve of ``dtype`` and the depthwise ones, 3 x 3 and 7 x 7, sharing ``budget``:
    the dense ones timed ``cold`` (their weights from memory, as a model's), the depthwise ones
    ``produced`` (a filter per channel is a few hundred weights: the input, which the op before it
    just wrote, is what it reads; flushed, 96 channels of 56 x 56 by 7 x 7 took 0.52 ms, against
    0.33 after the op before)."""
    dense = measured_curve(cold, Budget(budget.left() / 2), DENSE, lambda shape: _dense(cold.device, dtype, shape), host_s)
    depthwise = measured_curve(produced, Budget(budget.left() / 2), DEPTHWISE, lambda shape: _depthwise(produced.device, dtype, shape), host_s)
    wide = measured_curve(produced, budget, WIDE_DEPTHWISE, lambda shape: _depthwise(produced.device, dtype, shape), host_s)
    return {"convolution": dense, "depthwise_convolution": depthwise, "wide_depthwise_convolution": wide}


def _image_grid(timer: CallTimer, dtype: torch.dtype, budget: Budget, sizes: Sequence[int], channels: Sequence[int], kernel: int, expansion: int,
                most_flops: float, convolve: Optional[Convolve] = None, kept: Callable[[int, int], bool] = lambda size, inputs: True) -> ProductGrid:
    """The rates of dense ``kernel`` x ``kernel`` convolutions of stride 1 of ``dtype``, from ``c``
    of ``channels`` to ``expansion`` times as many, over square images of ``sizes``: a grid by
    positions and weight size, timed in interleaved passes while ``budget`` lasts (none over
    ``most_flops``, only the sides and input channels ``kept`` accepts; each by ``convolve`` where given); one
    not timed takes the rate of the largest timed one of its row, or of the row below."""
    def weight(inputs: int) -> int:
        return kernel * kernel * expansion * inputs * inputs

    cells = sorted((2.0 * size * size * weight(inputs), size, inputs) for size in sizes for inputs in channels
                   if 2.0 * size * size * weight(inputs) <= most_flops and kept(size, inputs))
    medians = interleaved_medians(timer, budget, [(flops, _convolution(timer.device, dtype, inputs, expansion * inputs, size, kernel, 1, 1, convolve)[1])
                                                  for flops, size, inputs in cells])
    timed = {(size, inputs): flops / seconds for (flops, size, inputs), seconds in zip(cells, medians) if seconds is not None}
    return measured_grid([size * size for size in sizes], [weight(inputs) for inputs in channels], timed, (sizes, channels))


def pointwise_grid(timer: CallTimer, dtype: torch.dtype, budget: Budget) -> ProductGrid:
    """The rates of 1 x 1 convolutions of ``dtype`` by positions and weight size (:func:`_image_grid`),
    each by oneDNN's kernel where torch would run its own on some (float32 on a CPU:
    :func:`~jitflops.estimates.costs.convolution.runs_natively`; :func:`native_pointwise_grid` times those)."""
    one_dnn = _one_dnn if dtype == torch.float32 and timer.device.type == "cpu" and torch.backends.mkldnn.is_available() else None
    return _image_grid(timer, dtype, budget, POINTWISE_SIZES, POINTWISE_CHANNELS, 1, 4, POINTWISE_MOST_FLOPS, one_dnn)


def native_pointwise_grid(timer: CallTimer, budget: Budget) -> ProductGrid:
    """The rates of the float32 1 x 1 convolutions torch runs with its own kernel on a CPU (an image
    of one sample and at most 20,480 elements; with one intra-op thread, every one) by positions and
    weight size (:func:`_image_grid`): MobileNetV2's expansions over 14 x 14 and 7 x 7 positions, a
    squeeze-and-excitation's over one."""
    def native(size: int, inputs: int) -> bool:
        return runs_natively(TensorMeta((1, inputs, size, size), torch.float32), "float32", torch.get_num_threads())
    return _image_grid(timer, torch.float32, budget, POINTWISE_SIZES, NATIVE_POINTWISE_CHANNELS, 1, 4, POINTWISE_MOST_FLOPS, _native, native)


def three_by_three_grid(timer: CallTimer, dtype: torch.dtype, budget: Budget) -> ProductGrid:
    """The rates of dense 3 x 3 convolutions of stride 1 of ``dtype`` by positions and weight size
    (:func:`_image_grid`; ``timer``: one that produces their inputs, as the op before writes them).
    Their FLOPs alone do not set their time: on the 2-core EPYC, ResNet-50's
    four stages' 3 x 3 convolutions are 231 MFLOPs each, and 64 channels over 56 x 56 positions took
    0.65 ms on an input just written (0.72 after a flush), 512 over 7 x 7 1.07 ms (1.38; in the model
    0.65 and 1.15 to 1.28); priced on the dense curve at 0.79 each, the last stage's were its worst
    modules (-30% to -46%); timed after a flush, the first three stages' were priced 30% to 44% over
    their time in the model. A strided one is read at its output's positions: ResNet-50's last stage's first, of stride 2, took as long as those of
    stride 1 after it (1.23-1.28 ms against 1.13-1.34)."""
    return _image_grid(timer, dtype, budget, THREE_BY_THREE_SIZES, THREE_BY_THREE_CHANNELS, 3, 1, THREE_BY_THREE_MOST_FLOPS)


def grouped_grid(timer: CallTimer, dtype: torch.dtype, budget: Budget) -> ProductGrid:
    """The rates of grouped 3 x 3 convolutions of ``dtype`` by the reduction of an output (a group's
    input channels times the kernel's 9) and FLOPs: a :class:`ProductGrid` whose ``rows`` are
    reductions and whose ``weights`` are FLOPs, timed in interleaved passes while ``budget`` lasts
    (an image of the side that comes nearest each column's FLOPs; a cell not timed takes the rate of
    the largest timed one of its row, or of the row below)."""
    cells = []
    for width in GROUP_WIDTHS:
        groups = _groups_of(width)
        for flops in GROUPED_FLOPS:
            side = max(round(math.sqrt(flops / (2.0 * 9 * groups * width * width))), 2)
            work, make = _convolution(timer.device, dtype, groups * width, groups * width, side, 3, 1, groups)
            cells.append((work, width, flops, make))
    cells.sort(key=lambda cell: cell[0])
    medians = interleaved_medians(timer, budget, [(work, make) for work, _, _, make in cells])
    timed = {(width, flops): work / seconds for (work, width, flops, _), seconds in zip(cells, medians) if seconds is not None}
    return measured_grid([9 * width for width in GROUP_WIDTHS], GROUPED_FLOPS, timed, (GROUP_WIDTHS, GROUPED_FLOPS))
