"""Activation counts: the number of output elements of the ops that produce activations.

fvcore's definition: only dot-product ops (convolutions, matrix products, einsum, linear layers)
produce activations. jitflops adds the ones fvcore misses: ``mm`` and the other matrix-product
forms, attention, and recurrent layers (their output sequence).
"""

from __future__ import annotations

from ..core.records import OpRecord
from .attention import ATTENTION_KERNELS, SEQUENCE_FIRST_KERNELS
from .convolution import CONVOLUTION_KINDS, TRANSPOSED_KINDS
from .registry import ACTIVATION_FORMULAS, with_inplace
from .shapes import prod


@ACTIVATION_FORMULAS.register(*CONVOLUTION_KINDS, *TRANSPOSED_KINDS, "aten::conv_tbc", key="conv")
def convolution_activations(op: OpRecord) -> int:
    return op.output_numel()


@ACTIVATION_FORMULAS.register(
    "aten::bmm", "aten::mm", "aten::mv",
    "aten::matmul", "aten::dot", "aten::vdot", "aten::inner", "aten::einsum", "aten::linear",
    "aten::scaled_dot_product_attention", "aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu",
    "aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell", "aten::rnn_relu_cell",
    *with_inplace("addmm addmv addbmm baddbmm addr"),
    "aten::outer", "aten::ger", "aten::tensordot", "aten::linalg_multi_dot", "aten::chain_matmul", "aten::linalg_vecdot",
    "aten::_grouped_mm", "aten::_scaled_grouped_mm", "aten::_scaled_mm", "aten::_scaled_mm_v2", "aten::bilinear", "aten::_trilinear",
    "transformers::grouped_mm_fallback", *ATTENTION_KERNELS, *SEQUENCE_FIRST_KERNELS,
)
def product_activations(op: OpRecord) -> int:
    return op.output_numel()


@ACTIVATION_FORMULAS.register("aten::_native_multi_head_attention")
def multi_head_attention_activations(op: OpRecord) -> int:
    """What the unfused layer's products output: query, key and value projections, attention and
    the output projection."""
    return _attention_block_activations(op.shape("query"), op.shape("key"), op.arg("embed_dim"))


@ACTIVATION_FORMULAS.register("aten::_transformer_encoder_layer_fwd")
def transformer_encoder_layer_activations(op: OpRecord) -> int:
    """The attention block's, and the outputs of the two feed-forward layers."""
    source = op.shape("src")
    tokens = prod(source[:-1])
    hidden = op.shape("ffn_weight_1")[0]
    return _attention_block_activations(source, source, op.arg("embed_dim")) + tokens * (hidden + op.arg("embed_dim"))


def _attention_block_activations(query: tuple[int, ...], key: tuple[int, ...], embed_dim: int) -> int:
    queries, keys = prod(query[:-1]), prod(key[:-1])
    return (3 * queries + 2 * keys) * embed_dim
