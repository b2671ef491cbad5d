"""Handles and the tables that map op kinds to them.

Two kinds of handle are accepted everywhere a handle is:

* a :class:`ShapeFormula`, jitflops' own: a small pure function of an
  :class:`~jitflops.core.records.OpRecord`, registered with a decorator. It works with
  every front end (the JIT trace today, the dispatch backend later).
* any other callable is an fvcore-style handle: it receives the op's JIT
  ``torch._C.Value`` inputs and outputs, exactly as ``fvcore`` calls it, so handles
  written for fvcore work unchanged.

A handle returns a number (counted under the op's short name, or the formula's
``key``) or a ``Counter`` of numbers keyed by whatever names it chooses.
"""

from __future__ import annotations

import typing
from collections import Counter
from dataclasses import dataclass
from numbers import Number
from typing import Any, Callable, Mapping, Optional, Union

from ..core.records import JitOpRecord, OpRecord

Count = Union[Number, typing.Counter[str]]
FvcoreHandle = Callable[[list, list], Count]


@dataclass(frozen=True)
class ShapeFormula:
    """A handle computed from an op record; ``key`` overrides the op's short name in results.

    It can also be called as fvcore calls a handle, ``formula(inputs, outputs)`` with the op's JIT
    values, so the default tables (``flop_count._DEFAULT_SUPPORTED_OPS``) serve code written for
    fvcore's; a ``key`` then names the count, as fvcore's convolution handle does.
    """

    compute: Callable[[OpRecord], Count]
    key: Optional[str] = None

    def __call__(self, *args: Any) -> Count:
        if len(args) == 1:
            return self.compute(args[0])
        inputs, outputs = args
        node = outputs[0].node()
        count = self.compute(JitOpRecord(node, node.kind(), ""))
        return Counter({self.key: count}) if self.key else count


Handle = Union[ShapeFormula, FvcoreHandle]


class FormulaTable:
    """A named set of shape formulas, filled by the ``register`` decorator of each op family."""

    def __init__(self, description: str) -> None:
        self.description = description
        self._formulas: dict[str, ShapeFormula] = {}

    def register(self, *kinds: str, key: Optional[str] = None) -> Callable[[Callable[[OpRecord], Count]], Callable[[OpRecord], Count]]:
        """Register the decorated function as the formula of every op kind in ``kinds``."""

        def decorate(compute: Callable[[OpRecord], Count]) -> Callable[[OpRecord], Count]:
            formula = ShapeFormula(compute, key)
            for kind in kinds:
                if kind in self._formulas:
                    raise ValueError(f"{self.description}: {kind} registered twice")
                self._formulas[kind] = formula
            return compute

        return decorate

    def handles(self) -> dict[str, ShapeFormula]:
        return dict(self._formulas)

    def kinds(self) -> frozenset[str]:
        return frozenset(self._formulas)


FLOP_FORMULAS = FormulaTable("flop formulas")
"""Ops counted by default: matrix products, convolutions, norms, attention, recurrent layers, resampling."""

ELEMENTWISE_FLOP_FORMULAS = FormulaTable("elementwise flop formulas")
"""Elementwise arithmetic, activations, reductions and softmax: known ops, counted only on request."""

ACTIVATION_FORMULAS = FormulaTable("activation formulas")
"""Ops whose outputs count as activations (fvcore's definition: the outputs of dot-product ops)."""


def with_inplace(names: str) -> list[str]:
    """``"add mul"`` -> the ``aten::`` kinds of those ops and of their in-place forms (``aten::add_``)."""
    return [f"aten::{name}{suffix}" for name in names.split() for suffix in ("", "_")]


def short_op_name(kind: str) -> str:
    """``aten::batch_norm`` -> ``batch_norm``; the key a number returned by a handle is counted under."""
    _, sep, rest = kind.partition("::")
    return rest if sep else kind


def counter_of(counts: Mapping[str, Any]) -> typing.Counter[str]:
    """``Counter(counts)``, made as a dict is: ``Counter``'s constructor runs its generic ``update`` in
    Python, which cost a fifth of a small model's aggregation (a Counter per op and per module)."""
    counter: typing.Counter[str] = dict.__new__(Counter)
    dict.update(counter, counts)
    return counter


def as_counter(kind: str, handle: Handle, result: Any) -> typing.Counter[str]:
    key = handle.key if isinstance(handle, ShapeFormula) and handle.key else short_op_name(kind)
    return counter_of({key: result})
