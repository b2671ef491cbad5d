"""``torch.einsum``: the multiply-adds of the batched products torch's own einsum runs.

torch computes an einsum pairwise (left to right, or along the ``path`` that ``torch.backends.opt_einsum``
chose, which the op records). Before each pair it sums out the indices no other remaining operand
needs; a pair with a contracted index becomes one ``bmm`` of ``(batch, left-only, summed) x (batch,
summed, right-only)`` over the broadcast sizes; a pair without one is an elementwise ``mul``. This
formula replays that on the shapes, so it is what the dispatch backend and ``FlopCounterMode``
see when the same einsum runs: one multiply-add per point of each ``bmm``, the sums and ``mul``\\ s
being elementwise work (not counted, as for ``sum`` and ``mul``). A lone operand only permutes,
takes diagonals or sums: nothing is counted.

For the usual two-operand contractions this is fvcore's count. fvcore charges half an outer or
Hadamard product, which torch runs as ``mul``; this charges none.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..core.errors import OpShapeError
from ..core.records import OpRecord, TensorMeta
from .registry import FLOP_FORMULAS
from .shapes import prod

Sizes = dict[str, int]
"""An operand aligned to the equation's indices: index -> size (1 where absent or broadcast)."""


def parse_equation(equation: str, shapes: Sequence[tuple[int, ...]]) -> tuple[list[str], str]:
    """Per-operand index strings and the output's; ellipsis dims become placeholder indices outside
    ``[A-Za-z]``, so they never meet the equation's own."""
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"equation {equation!r} names {len(terms)} operands, got {len(shapes)}")
    ellipsis_rank = max((len(shape) - len(term.replace("...", "")) for term, shape in zip(terms, shapes) if "..." in term), default=0)
    placeholders = "".join(chr(0x100 + i) for i in range(ellipsis_rank))
    operands = []
    for term, shape in zip(terms, shapes):
        if "..." in term:
            own_rank = len(shape) - len(term.replace("...", ""))
            term = term.replace("...", placeholders[ellipsis_rank - own_rank:])
        if len(term) != len(shape):
            raise ValueError(f"operand {term!r} of {equation!r} does not match shape {shape}")
        operands.append(term)
    if arrow:
        output = rhs.replace("...", placeholders)
    else:
        counts = {index: sum(term.count(index) for term in operands) for index in set("".join(operands))}
        output = placeholders + "".join(sorted(i for i, c in counts.items() if c == 1 and i not in placeholders))
    return operands, output


def _aligned(term: str, shape: tuple[int, ...], indices: str) -> Sizes:
    sizes = {index: 1 for index in indices}
    for index, size in zip(term, shape):
        sizes[index] = size  # a repeated index is a diagonal: same size
    return sizes


def sumproduct_pair_macs(left: Sizes, right: Sizes, summed: set[str]) -> tuple[int, Sizes]:
    """Multiply-adds of torch's ``sumproduct_pair`` (``(left * right).sum(summed)`` as one ``bmm``)
    and the sizes of its result. Without a summed index it is a ``mul``: none. A summed index that
    only one side has is summed on that side first, outside the product."""
    result = {index: max(left[index], right[index]) for index in left}
    if not summed:
        return 0, result
    left, right = dict(left), dict(right)
    for index in summed:
        result[index] = 1
        if left[index] == 1 or right[index] == 1:
            left[index] = right[index] = 1
    return prod(max(left[index], right[index]) for index in left), result


def einsum_macs(equation: str, shapes: Sequence[tuple[int, ...]], path: Optional[Sequence[int]] = None) -> int:
    """Multiply-adds of ``torch.einsum(equation, *operands)`` for operands of ``shapes``, contracted
    in torch's order: pairs from ``path`` (opt_einsum's format, flattened) or left to right."""
    terms, output = parse_equation(equation, shapes)
    indices = "".join(sorted(set("".join(terms))))
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        for index, size in zip(term, shape):
            if size != 1 and sizes.setdefault(index, size) != size:
                raise ValueError(f"index {index!r} of {equation!r} has sizes {sizes[index]} and {size}")
    contracted = [index for index in indices if index not in output]
    operands = [_aligned(term, shape, indices) for term, shape in zip(terms, shapes)]
    holders = {index: sum(1 for sizes in operands if sizes[index] != 1) for index in contracted}
    steps = iter(path or ())
    macs = 0
    while len(operands) > 1:
        i, j = (sorted((next(steps), next(steps))) if path else (0, 1))
        left, right = dict(operands[i]), dict(operands[j])
        del operands[j], operands[i]
        summed: set[str] = set()
        for index in contracted:
            if left[index] != 1 and right[index] != 1:
                holders[index] -= 1
                if holders[index] == 1:
                    summed.add(index)
                    holders[index] = 0
            elif holders[index] == 1:  # held by one side alone: summed out before the product
                side = left if left[index] != 1 else right if right[index] != 1 else None
                if side is not None:
                    side[index] = 1
                    holders[index] = 0
        step, result = sumproduct_pair_macs(left, right, summed)
        macs += step
        if path:
            operands.append(result)
        else:
            operands.insert(0, result)
    return macs


@FLOP_FORMULAS.register("aten::einsum")
def einsum_flops(op: OpRecord) -> int:
    tensors = op.arg("tensors")
    if not isinstance(tensors, list) or not all(isinstance(t, TensorMeta) and t.shape is not None for t in tensors):
        raise OpShapeError(op.kind, op.scope, f"operand shapes were not recorded: {tensors!r}")
    path = op.arg_or("path", None)
    try:
        return einsum_macs(op.arg("equation"), [t.shape for t in tensors], path)
    except (ValueError, StopIteration) as error:
        raise OpShapeError(op.kind, op.scope, f"does not fit its operands: {error}") from None
