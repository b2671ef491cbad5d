"""Pairwise distances between two sets of vectors: product-like work, counted by default.

``cdist`` of ``P`` and ``R`` vectors of ``M`` features compares every pair: one multiply-add per
pair per feature (``_cdist_forward``). For the Euclidean distance between larger sets torch
instead runs a matrix product of the vectors extended by their squared norms and a column of ones
(``_euclidean_dist``: ``M + 2`` per pair); ``cdist`` is counted as the kernel torch chooses, by
torch's own rule. ``pdist`` compares the ``N (N - 1) / 2`` pairs within one set.

Row-wise distances and similarities (``pairwise_distance``, ``cosine_similarity``, ``dist``) are
elementwise work, with the losses.

Backward (dispatch front end): ``_cdist_backward`` computes the gradient of one set (torch calls it
once per set that needs one) with one multiply-add per pair per feature, as the forward;
``_pdist_backward`` likewise for the one set.
"""

from __future__ import annotations

from ..core.records import OpRecord
from .registry import FLOP_FORMULAS
from .shapes import prod

_MATMUL_ABOVE = 25
"""torch's ``cdist`` takes the matrix-product path for p=2 when either set has more vectors (compute_mode 0)."""


def _pairs_and_features(op: OpRecord) -> tuple[int, int]:
    first, second = op.shape("x1"), op.shape("x2")
    batch = max(prod(first[:-2]), prod(second[:-2]))
    return batch * first[-2] * second[-2], first[-1]


@FLOP_FORMULAS.register("aten::_cdist_forward", "aten::_cdist_backward")
def cdist_kernel_flops(op: OpRecord) -> int:
    pairs, features = _pairs_and_features(op)
    return pairs * features


@FLOP_FORMULAS.register("aten::_euclidean_dist")
def euclidean_dist_flops(op: OpRecord) -> int:
    pairs, features = _pairs_and_features(op)
    return pairs * (features + 2)


@FLOP_FORMULAS.register("aten::cdist")
def cdist_flops(op: OpRecord) -> int:
    mode = op.arg("compute_mode") or 0
    first, second = op.shape("x1"), op.shape("x2")
    uses_matmul = op.arg("p") == 2 and (mode == 1 or (mode == 0 and max(first[-2], second[-2]) > _MATMUL_ABOVE))
    return euclidean_dist_flops(op) if uses_matmul else cdist_kernel_flops(op)


@FLOP_FORMULAS.register("aten::pdist", "aten::_pdist_forward", "aten::_pdist_backward")
def pdist_flops(op: OpRecord) -> int:
    vectors, features = op.shape("self")
    return vectors * (vectors - 1) // 2 * features
