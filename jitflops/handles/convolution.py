"""Convolutions, plain, grouped and transposed, in any number of spatial dims (fvcore's formula).

Backward (dispatch front end): the gradient of the input and the gradient of the weight each cost
what the forward costs; the bias gradient, a sum, is not counted.
"""

from __future__ import annotations

from ..core.records import OpRecord
from .registry import FLOP_FORMULAS
from .shapes import prod


def conv_macs(input_shape: tuple[int, ...], weight_shape: tuple[int, ...], output_shape: tuple[int, ...], transposed: bool) -> int:
    """Multiply-adds of a convolution; the bias is not counted.

    A plain convolution does ``prod(weight)`` multiply-adds per output position (the weight holds
    ``out x in/groups x kernel``); a transposed one scatters ``prod(weight)`` per *input* position.
    An unbatched input (one dimension fewer than the weight: ``conv2d`` of a ``C x H x W`` image) is
    a batch of one, as torch runs it (an export graph keeps the public op on the unbatched input).
    """
    if len(input_shape) == len(weight_shape) - 1:
        input_shape, output_shape = (1, *input_shape), (1, *output_shape)
    batch = input_shape[0]
    positions = (input_shape if transposed else output_shape)[2:]
    return batch * prod(weight_shape) * prod(positions)


CONVOLUTION_KINDS = (
    "aten::_convolution", "aten::convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::_convolution_mode",
    "aten::convolution_overrideable", "aten::mkldnn_convolution", "aten::cudnn_convolution", "aten::miopen_convolution",
    "aten::_slow_conv2d_forward", "aten::slow_conv3d_forward", "aten::slow_conv_dilated2d", "aten::slow_conv_dilated3d",
    "aten::thnn_conv2d", "aten::_conv_depthwise2d", "aten::_nnpack_spatial_convolution",
)
"""Convolutions by every name torch gives them: the public ops, string padding (``_convolution_mode``)
and the backend kernels a dispatch-level recording can meet."""

TRANSPOSED_KINDS = (
    "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d", "aten::slow_conv_transpose2d",
    "aten::slow_conv_transpose3d", "aten::cudnn_convolution_transpose", "aten::miopen_convolution_transpose",
)


CUDNN_TF32_KINDS = frozenset({*CONVOLUTION_KINDS, *TRANSPOSED_KINDS, "aten::conv_tbc", "aten::convolution_backward"})
"""The convolutions, forward and backward: float32 ones run on a GPU's TF32 tensor cores under
``torch.backends.cudnn.allow_tf32`` (on by default), not ``torch.backends.cuda.matmul.allow_tf32``
(off by default), which governs the products."""


@FLOP_FORMULAS.register(*CONVOLUTION_KINDS, key="conv")
def convolution_flops(op: OpRecord) -> int:
    transposed = bool(op.arg_or("transposed", False))
    return conv_macs(op.operand_shape(), op.shape("weight"), op.output_shape(), transposed)


@FLOP_FORMULAS.register(*TRANSPOSED_KINDS, key="conv")
def conv_transpose_flops(op: OpRecord) -> int:
    return conv_macs(op.operand_shape(), op.shape("weight"), op.output_shape(), transposed=True)


@FLOP_FORMULAS.register("aten::conv_tbc", key="conv")
def conv_tbc_flops(op: OpRecord) -> int:
    """Time-batch-channel layout: ``weight`` is ``kernel x in x out``, the output ``time x batch x out``."""
    time, batch, _ = op.output_shape()
    return time * batch * prod(op.shape("weight"))


@FLOP_FORMULAS.register("aten::convolution_backward", key="conv")
def convolution_backward_flops(op: OpRecord) -> int:
    input_grad, weight_grad, _ = op.arg("output_mask")
    forward = conv_macs(op.shape("input"), op.shape("weight"), op.shape("grad_output"), bool(op.arg("transposed")))
    return forward * (int(bool(input_grad)) + int(bool(weight_grad)))
