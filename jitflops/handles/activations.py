"""Activation counts: the number of output elements of the ops that produce activations.

fvcore's definition: only dot-product ops (convolutions, matrix products, einsum, linear layers)
produce activations. jitflops adds the ones fvcore misses: ``mm`` and the other matrix-product
forms, attention, and recurrent layers (their output sequence).
"""

from __future__ import annotations

from ..records import OpRecord
from .registry import ACTIVATION_FORMULAS


@ACTIVATION_FORMULAS.register(
    "aten::_convolution", "aten::convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d",
    "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d", key="conv",
)
def convolution_activations(op: OpRecord) -> int:
    return op.output_numel()


@ACTIVATION_FORMULAS.register(
    "aten::addmm", "aten::addmv", "aten::addbmm", "aten::baddbmm", "aten::bmm", "aten::mm", "aten::mv",
    "aten::matmul", "aten::dot", "aten::vdot", "aten::inner", "aten::einsum", "aten::linear",
    "aten::scaled_dot_product_attention", "aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu",
    "aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell", "aten::rnn_relu_cell",
)
def product_activations(op: OpRecord) -> int:
    return op.output_numel()
