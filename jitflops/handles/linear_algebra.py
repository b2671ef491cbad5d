"""Matrix products. One multiply-add counts as one flop; the bias (``addmm``'s ``self``) is not counted."""

from __future__ import annotations

import torch

from ..errors import OpShapeError
from ..records import OpRecord
from .registry import FLOP_FORMULAS
from .shapes import prod


def matmul_macs(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Multiply-adds of ``torch.matmul(a, b)`` for any ranks, 1-D operands and broadcast batch dims included.

    A 1-D left operand is a row vector, a 1-D right operand a column vector, as in ``torch.matmul``.
    """
    if not a or not b:
        raise ValueError(f"matmul of a 0-d tensor: {a} @ {b}")
    left = (1, a[0]) if len(a) == 1 else a
    right = (b[0], 1) if len(b) == 1 else b
    (n, k), (k_right, m) = left[-2:], right[-2:]
    if k != k_right:
        raise ValueError(f"inner dimensions differ: {a} @ {b}")
    batch = torch.broadcast_shapes(left[:-2], right[:-2])
    return prod(batch) * n * k * m


def _checked_matmul(op: OpRecord, left: str, right: str) -> int:
    try:
        return matmul_macs(op.shape(left), op.shape(right))
    except ValueError as error:
        raise OpShapeError(op.kind, op.scope, str(error)) from None


@FLOP_FORMULAS.register("aten::matmul", "aten::mm", "aten::bmm", "aten::dot", "aten::mv", "aten::vdot", "aten::inner")
def matmul_flops(op: OpRecord) -> int:
    """``self @ other`` (mm: ``self @ mat2``; mv: ``self @ vec``; dot, vdot, inner: the vector product)."""
    names = op.arg_names or ()
    right = next(name for name in ("other", "mat2", "vec", "tensor") if name in names)
    return _checked_matmul(op, "self", right)


@FLOP_FORMULAS.register("aten::addmm", "aten::addmv", "aten::addbmm")
def addmm_flops(op: OpRecord) -> int:
    """``beta * self + mat1 @ mat2``: the product only (addmv: ``mat @ vec``; addbmm: summed ``batch1 @ batch2``)."""
    names = op.arg_names or ()
    if "mat1" in names:
        return _checked_matmul(op, "mat1", "mat2")
    if "vec" in names:
        return _checked_matmul(op, "mat", "vec")
    return _checked_matmul(op, "batch1", "batch2")


@FLOP_FORMULAS.register("aten::baddbmm")
def baddbmm_flops(op: OpRecord) -> int:
    """``beta * self + batch1 @ batch2``: the batched product only."""
    return _checked_matmul(op, "batch1", "batch2")


@FLOP_FORMULAS.register("aten::linear")
def linear_flops(op: OpRecord) -> int:
    """``input @ weight.T``: every input row meets every output feature."""
    weight = op.shape("weight")
    out_features = weight[0] if len(weight) == 2 else 1
    return prod(op.shape("input")) * out_features
