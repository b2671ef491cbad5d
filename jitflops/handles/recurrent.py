"""RNN, LSTM and GRU layers and cells.

Every step multiplies the input by ``w_ih`` and the hidden state by ``w_hh`` (and, for LSTMs with
``proj_size``, by ``w_hr``), for every layer and direction: that is one multiply-add per element of
every weight matrix per token. So the count is ``tokens x sum of the weight matrices' sizes``, read
from the weights themselves, which covers gates (4 for LSTM, 3 for GRU, 1 for RNN), stacked layers,
bidirectional layers, projections and packed sequences alike. Biases and the gates' elementwise
work are not counted.

On the dispatch front end a layer runs as one kernel per layer and direction (``mkldnn_rnn_layer``
on the CPU, ``_cudnn_rnn`` on a GPU); a backward costs twice its forward (gradients of the inputs
and of the weights).
"""

from __future__ import annotations

from ..core.errors import OpShapeError
from ..core.records import OpRecord, TensorMeta
from .registry import FLOP_FORMULAS
from .shapes import prod


def _weight_matrix_elements(op: OpRecord, tensors: object) -> int:
    if not isinstance(tensors, list) or not all(isinstance(t, TensorMeta) and t.shape is not None for t in tensors):
        raise OpShapeError(op.kind, op.scope, f"weights were not recorded as tensors: {tensors!r}")
    return sum(t.numel for t in tensors if len(t.shape) == 2)


def _tokens(op: OpRecord) -> int:
    """All but the feature dim of the input (``data`` for packed sequences)."""
    sequence = op.shape("input") if op.has_arg("input") else op.shape("data")
    return prod(sequence[:-1])


@FLOP_FORMULAS.register("aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu")
def recurrent_layer_flops(op: OpRecord) -> int:
    return _tokens(op) * _weight_matrix_elements(op, op.arg("params"))


@FLOP_FORMULAS.register("aten::_cudnn_rnn")
def cudnn_rnn_flops(op: OpRecord) -> int:
    return _tokens(op) * _weight_matrix_elements(op, op.arg("weight"))


@FLOP_FORMULAS.register("aten::mkldnn_rnn_layer")
def mkldnn_rnn_layer_flops(op: OpRecord) -> int:
    """One layer and direction: ``weight0`` is ``w_ih``, ``weight1`` is ``w_hh``."""
    return _tokens(op) * (prod(op.shape("weight0")) + prod(op.shape("weight1")))


@FLOP_FORMULAS.register("aten::mkldnn_rnn_layer_backward")
def mkldnn_rnn_layer_backward_flops(op: OpRecord) -> int:
    return 2 * _tokens(op) * (prod(op.shape("weight1")) + prod(op.shape("weight2")))


@FLOP_FORMULAS.register("aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell", "aten::rnn_relu_cell")
def recurrent_cell_flops(op: OpRecord) -> int:
    batch = prod(op.shape("input")[:-1])
    return batch * (prod(op.shape("w_ih")) + prod(op.shape("w_hh")))
