"""Normalisation layers over inputs of any rank.

fvcore's per-element costs, kept so published numbers reproduce: batch norm in training and the
group, layer and instance norms cost 5 flops per element with an affine transform and 4 without
(mean, subtract, variance, normalise, and the scale-shift); batch norm in inference mode is a fused
scale-shift, 2 per element with affine and 1 without. ``rms_norm`` skips the mean subtraction:
4 per element with a weight (square, accumulate, normalise, scale), 3 without.
"""

from __future__ import annotations

from ..records import OpRecord
from .registry import FLOP_FORMULAS
from .shapes import prod


def _per_element(op: OpRecord, with_affine: int, without_affine: int) -> int:
    has_affine = op.optional_shape("weight") is not None
    return prod(op.shape("input")) * (with_affine if has_affine else without_affine)


@FLOP_FORMULAS.register("aten::batch_norm")
def batch_norm_flops(op: OpRecord) -> int:
    if op.arg("training"):
        return _per_element(op, 5, 4)
    return _per_element(op, 2, 1)


@FLOP_FORMULAS.register("aten::group_norm", "aten::layer_norm", "aten::instance_norm")
def normalization_flops(op: OpRecord) -> int:
    return _per_element(op, 5, 4)


@FLOP_FORMULAS.register("aten::rms_norm")
def rms_norm_flops(op: OpRecord) -> int:
    return _per_element(op, 4, 3)
