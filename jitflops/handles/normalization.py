"""Normalisation layers over inputs of any rank.

fvcore's per-element costs, kept so published numbers reproduce: batch norm in training and the
group, layer and instance norms cost 5 flops per element with an affine transform and 4 without
(mean, subtract, variance, normalise, and the scale-shift); batch norm in inference mode is a fused
scale-shift, 2 per element with affine and 1 without. ``rms_norm`` skips the mean subtraction:
4 per element with a weight (square, accumulate, normalise, scale), 3 without.

The dispatch front end sees the ``native_*`` forms of the same ops, and their backward, which is
counted as twice the forward (the gradients of the input and of the affine parameters). On a GPU,
float32 and float16 batch norms run cuDNN's (or MIOpen's) kernel, whose backward exists for batch
statistics alone: torch differentiates a ``training=False`` call through ``native_batch_norm_backward``.
"""

from __future__ import annotations

from ..core.records import OpRecord
from .registry import FLOP_FORMULAS
from .shapes import prod


def _per_element(op: OpRecord, with_affine: int, without_affine: int) -> int:
    has_affine = op.optional_shape("weight") is not None
    return prod(op.shape("input")) * (with_affine if has_affine else without_affine)


_TRAINING_KINDS = frozenset({"aten::_batch_norm_with_update", "aten::_batch_norm_with_update_functional"})
_BATCH_STATISTICS_BACKWARDS = frozenset({"aten::cudnn_batch_norm_backward", "aten::miopen_batch_norm_backward"})


def _training(op: OpRecord) -> bool:
    """Batch norm normalises with batch statistics: ``training`` (``train`` in the backward,
    ``update`` in the backward of the ``_with_update`` forms), or the ``_with_update`` forms and
    cuDNN's and MIOpen's backward; the ``_no_training``/``_no_update`` forms use the running ones."""
    if op.kind in _TRAINING_KINDS or op.kind in _BATCH_STATISTICS_BACKWARDS:
        return True
    for name in ("training", "train", "update"):
        if op.has_arg(name):
            return bool(op.arg(name))
    return False


@FLOP_FORMULAS.register(
    "aten::batch_norm", "aten::native_batch_norm", "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit_no_training",
    "aten::_batch_norm_no_update", "aten::cudnn_batch_norm", "aten::miopen_batch_norm", *_TRAINING_KINDS,
)
def batch_norm_flops(op: OpRecord) -> int:
    return _per_element(op, 5, 4) if _training(op) else _per_element(op, 2, 1)


@FLOP_FORMULAS.register("aten::group_norm", "aten::layer_norm", "aten::instance_norm", "aten::native_group_norm", "aten::native_layer_norm")
def normalization_flops(op: OpRecord) -> int:
    return _per_element(op, 5, 4)


@FLOP_FORMULAS.register("aten::rms_norm", "aten::_fused_rms_norm")
def rms_norm_flops(op: OpRecord) -> int:
    return _per_element(op, 4, 3)


@FLOP_FORMULAS.register("aten::native_batch_norm_backward", "aten::batch_norm_backward", *_BATCH_STATISTICS_BACKWARDS)
def batch_norm_backward_flops(op: OpRecord) -> int:
    return 2 * batch_norm_flops(op)


@FLOP_FORMULAS.register("aten::native_layer_norm_backward", "aten::native_group_norm_backward")
def normalization_backward_flops(op: OpRecord) -> int:
    return 2 * normalization_flops(op)


@FLOP_FORMULAS.register("aten::_fused_rms_norm_backward")
def rms_norm_backward_flops(op: OpRecord) -> int:
    return 2 * rms_norm_flops(op)
