"""Convolutions: dense ones and depthwise ones, each a curve of time by FLOPs.

A 1 x 1 convolution is a product (its kernel is a matrix product over the positions): the product
grid prices it. A dense convolution with a larger kernel, and a depthwise one (a filter per channel:
MobileNets, ConvNeXt), run kernels of their own at rates of their own; each is timed on the layers
of a ResNet and of a MobileNetV2 at 224 x 224, batch 1.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .budget import Budget, CallTimer, Maker, measured_curve

DENSE = ((16, 16, 28, 3, 1), (3, 32, 224, 3, 2), (32, 32, 56, 3, 1), (3, 64, 224, 7, 2), (64, 64, 56, 3, 1), (256, 256, 14, 3, 1),
         (128, 128, 56, 3, 1), (256, 256, 28, 3, 1))
"""(in channels, out channels, size, kernel, stride) of dense convolutions from 4 to 900 MFLOPs: a
MobileNet's stem, ResNet-50's stem and 3 x 3 layers, and larger."""
DEPTHWISE = ((32, 112, 3, 1), (96, 112, 3, 2), (144, 56, 3, 1), (192, 28, 3, 1), (384, 14, 3, 1), (576, 14, 3, 1), (960, 7, 3, 1), (96, 56, 7, 1))
"""(channels, size, kernel, stride) of depthwise convolutions: MobileNetV2's, and ConvNeXt's 7 x 7."""


def _convolution(device: torch.device, dtype: torch.dtype, inputs: int, outputs: int, size: int, kernel: int, stride: int, groups: int) -> tuple[float, Maker]:
    out = (size + 2 * (kernel // 2) - kernel) // stride + 1

    def make() -> Callable[[], object]:
        x = torch.randn(1, inputs, size, size, device=device).to(dtype)
        w = torch.randn(outputs, inputs // groups, kernel, kernel, device=device).to(dtype)
        return lambda: F.conv2d(x, w, stride=stride, padding=kernel // 2, groups=groups)
    return 2.0 * outputs * out * out * inputs // groups * kernel * kernel, make


def _dense(device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int, int, int]) -> tuple[float, Maker]:
    inputs, outputs, size, kernel, stride = shape
    return _convolution(device, dtype, inputs, outputs, size, kernel, stride, 1)


def _depthwise(device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int, int]) -> tuple[float, Maker]:
    channels, size, kernel, stride = shape
    return _convolution(device, dtype, channels, channels, size, kernel, stride, channels)


def convolution_curves(timer: CallTimer, dtype: torch.dtype, budget: Budget, host_s: float) -> dict[str, tuple[tuple[float, float], ...]]:
    """The dense and the depthwise curve of ``dtype``, sharing ``budget``."""
    dense = measured_curve(timer, Budget(budget.left() / 2), DENSE, lambda shape: _dense(timer.device, dtype, shape), host_s)
    depthwise = measured_curve(timer, budget, DEPTHWISE, lambda shape: _depthwise(timer.device, dtype, shape), host_s)
    return {"convolution": dense, "depthwise_convolution": depthwise}
