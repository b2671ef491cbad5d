"""``torch.einsum`` for every equation: ellipses, implicit outputs, traces, outer products, many operands.

The count is the work of the cheapest pairwise contraction order (what ``opt_einsum`` picks):
each pairwise step does one multiply-add per point of the joint index space of its two operands.
A single operand costs one addition per input element when it sums over an index, and nothing
when it only permutes or takes a diagonal. For two operands this is fvcore's count; fvcore halves
steps without a summed index (outer and Hadamard products) and counts transposes, which this does not.
"""

from __future__ import annotations

import itertools
from typing import Sequence

from ..errors import OpShapeError
from ..records import OpRecord, TensorMeta
from .registry import FLOP_FORMULAS
from .shapes import prod

_EXHAUSTIVE_SEARCH_LIMIT = 5
"""Above this many operands the order is chosen greedily instead of by exhaustive search."""


def parse_equation(equation: str, shapes: Sequence[tuple[int, ...]]) -> tuple[list[str], str, dict[str, int]]:
    """Split an equation into per-operand index strings and the output, with every index's size.

    Ellipsis dimensions become upper-case placeholder indices; sizes of 1 broadcast.
    """
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"equation {equation!r} names {len(terms)} operands, got {len(shapes)}")
    ellipsis_rank = max((len(shape) - len(term.replace("...", "")) for term, shape in zip(terms, shapes) if "..." in term), default=0)
    placeholders = "".join(chr(ord("A") + i) for i in range(ellipsis_rank))
    sizes: dict[str, int] = {}
    operands = []
    for term, shape in zip(terms, shapes):
        if "..." in term:
            own_rank = len(shape) - len(term.replace("...", ""))
            term = term.replace("...", placeholders[ellipsis_rank - own_rank:])
        if len(term) != len(shape):
            raise ValueError(f"operand {term!r} of {equation!r} does not match shape {shape}")
        for index, size in zip(term, shape):
            if sizes.get(index, 1) != 1 and size not in (1, sizes[index]):
                raise ValueError(f"index {index!r} of {equation!r} has sizes {sizes[index]} and {size}")
            sizes[index] = max(sizes.get(index, 1), size)
        operands.append(term)
    if arrow:
        output = rhs.replace("...", placeholders)
    else:
        counts = {index: sum(term.count(index) for term in operands) for index in sizes}
        output = placeholders + "".join(sorted(i for i, c in counts.items() if c == 1 and i not in placeholders))
    return operands, output, sizes


def _single_operand_cost(term: str, output: str, sizes: dict[str, int]) -> int:
    sums_over_an_index = any(index not in output for index in term)
    return prod(sizes[i] for i in set(term)) if sums_over_an_index else 0


def _pairwise_cost(operands: list[frozenset[str]], output: frozenset[str], sizes: dict[str, int], exhaustive: bool) -> int:
    if len(operands) == 1:
        return 0
    best = None
    candidates = []
    for i, j in itertools.combinations(range(len(operands)), 2):
        joint = operands[i] | operands[j]
        rest = [operands[k] for k in range(len(operands)) if k not in (i, j)]
        still_needed = output.union(*rest)
        step = prod(sizes[index] for index in joint)
        candidates.append((step, rest + [joint & still_needed]))
    if not exhaustive:
        step, remaining = min(candidates, key=lambda candidate: candidate[0])
        return step + _pairwise_cost(remaining, output, sizes, exhaustive)
    for step, remaining in candidates:
        total = step + _pairwise_cost(remaining, output, sizes, exhaustive)
        best = total if best is None else min(best, total)
    return best  # type: ignore[return-value]


def einsum_macs(equation: str, shapes: Sequence[tuple[int, ...]]) -> int:
    """Multiply-adds of ``torch.einsum(equation, *operands)`` given the operands' shapes."""
    operands, output, sizes = parse_equation(equation, shapes)
    if len(operands) == 1:
        return _single_operand_cost(operands[0], output, sizes)
    exhaustive = len(operands) <= _EXHAUSTIVE_SEARCH_LIMIT
    return _pairwise_cost([frozenset(term) for term in operands], frozenset(output), sizes, exhaustive)


@FLOP_FORMULAS.register("aten::einsum")
def einsum_flops(op: OpRecord) -> int:
    tensors = op.arg("tensors")
    if not isinstance(tensors, list) or not all(isinstance(t, TensorMeta) and t.shape is not None for t in tensors):
        raise OpShapeError(op.kind, op.scope, f"operand shapes were not recorded: {tensors!r}")
    try:
        return einsum_macs(op.arg("equation"), [t.shape for t in tensors])
    except ValueError as error:
        raise OpShapeError(op.kind, op.scope, str(error)) from None
