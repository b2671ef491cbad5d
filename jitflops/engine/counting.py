"""The engine's pure steps: handles over a front end's ops, counts per scope, sums per module.

:func:`statistics_of` runs each op's handle on its record (a result validated: a count or a
``HandleError`` naming the op and the module), keys the counts by the op's full scope, and sums
them up the module hierarchy once per distinct scope, not once per op, by the ancestor mode.
:class:`~jitflops.engine.jit_analysis.JitModelAnalysis` keeps the settings and calls it.
"""

from __future__ import annotations

import math
import typing
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Number, Real
from types import MappingProxyType
from typing import Any, Iterator, NamedTuple, Optional

import torch
from torch import nn

from ..core.errors import HandleError, JitflopsError
from ..handles import Handle, ShapeFormula
from ..handles.registry import as_counter, counter_of
from ..core.op_source import OpSource
from ..core.records import FORWARD, RECOMPUTE, JitOpRecord, OpRecord


class OpCount(NamedTuple):
    """The count of one op call, in graph (execution) order: for per-op tables."""

    module: str
    kind: str
    handle: Handle
    count: float
    phase: str = "forward"


@dataclass(frozen=True)
class Statistics:
    """Results of one analysis: counts and unsupported ops per canonical module name, and per op call."""

    counts: dict[str, Mapping[str, float]]
    unsupported_ops: dict[str, Mapping[str, int]]
    """Both read-only: modules without any share one empty mapping (:data:`_NOTHING`)."""
    uncalled_mods: frozenset[str]
    op_counts: tuple[OpCount, ...]


_RECOMPUTED = f"{RECOMPUTE}."
"""The key prefix of a backward op's count of the forward work it recomputes."""

_NOTHING: Mapping[str, Any] = MappingProxyType({})
"""The counts of a module without any (most modules have no unsupported op)."""


def module_aliases(model: nn.Module, named_modules: Optional[Mapping[str, nn.Module]] = None) -> dict[Any, str]:
    """Map every module, and every name it is reachable by, to its canonical (first) name.

    ``named_modules``: the model's ``named_modules(remove_duplicate=False)`` when the caller has them.
    """
    aliases: dict[Any, str] = {}
    for name, module in (named_modules or dict(model.named_modules(remove_duplicate=False))).items():
        aliases.setdefault(module, name)
        aliases[name] = aliases[module]
    return aliases


def _add_into(totals: dict[str, typing.Counter[str]], name: str, ops: Mapping[str, float]) -> None:
    """``totals[name] += ops``, a new Counter where ``name`` has none (not ``Counter.update``: its
    generic checks cost more than the sum, once per module and scope)."""
    total = totals.get(name)
    if total is None:
        totals[name] = counter_of(ops)
        return
    for key, value in ops.items():
        total[key] += value


def _with_name_prefixes(names: set[str]) -> set[str]:
    """``names`` and every dotted prefix of them (``"a.b.c"`` adds ``"a.b"``, ``"a"`` and ``""``):
    their owners, in owner mode."""
    completed = set(names)
    for name in names:
        while name and (owner := name.rpartition(".")[0]) not in completed:  # an owner already there has its own owners
            completed.add(owner)
            name = owner
    return completed


def _is_count(value: Any) -> bool:
    """A finite, non-negative real number (numpy scalars included; bools, NaN, inf and complex numbers not)."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _validated(kind: str, scope: str, handle: Handle, result: Any) -> typing.Counter[str]:
    """A handle's result as a Counter of counts, or a ``HandleError`` naming the op and the module."""
    if type(result) is int and result >= 0:  # what formulas return: checked first, it is checked once per op
        return as_counter(kind, handle, result)
    if isinstance(result, torch.SymInt):  # a count in symbolic sizes (jitflops.engine.symbolic_counts)
        return as_counter(kind, handle, result)
    if isinstance(result, Number) and not isinstance(result, bool):
        counts = as_counter(kind, handle, result)
    elif isinstance(result, Mapping):
        counts = Counter(result)
    else:
        raise HandleError(kind, scope, f"returned {type(result).__name__} {result!r}, expected a number or a Counter")
    bad = {key: value for key, value in counts.items() if not _is_count(value)}
    if bad:
        raise HandleError(kind, scope, f"returned {bad!r}: counts must be finite, non-negative real numbers")
    return counts



def statistics_of(trace: OpSource, handles: Mapping[str, Handle], ignored: typing.Collection[str], aliases: Mapping[Any, str], ancestor_mode: str) -> Statistics:
    """What one analysis found in ``trace``: counts and unsupported ops per module, uncalled modules, each op's count."""
    scope_counts, scope_unsupported, op_counts = _count_per_scope(trace, handles, ignored)
    seen: set[str] = set()
    innermost: set[str] = set()
    for scope in trace.scopes():  # a module is called if an op ran in its scope (fvcore's rule)
        seen.update(scope.split("/"))
        innermost.add(scope.rpartition("/")[2])
    if ancestor_mode == "owner":  # and so are its owners
        seen |= _with_name_prefixes(innermost)
    uncalled = frozenset(set(aliases.values()) - seen)
    return Statistics(_per_module(scope_counts, aliases, ancestor_mode), _per_module(scope_unsupported, aliases, ancestor_mode), uncalled, tuple(op_counts))

def _per_module(per_scope: dict[str, typing.Counter[str]], aliases: Mapping[Any, str], ancestor_mode: str) -> dict[str, Mapping[str, float]]:
    """Sum counts keyed by full scope into every module they belong to, by the ancestor mode;
    every module of the model gets an entry, in the model's order."""
    totals: dict[str, typing.Counter[str]] = {}
    if ancestor_mode == "caller":
        for scope, ops in per_scope.items():
            for name in set(scope.split("/")):
                _add_into(totals, name, ops)
    else:
        # Owner mode: an op belongs to its innermost module and to every name prefix of it. Summed
        # bottom-up, deepest names first, so each module adds its subtotal to its parent once.
        by_depth: defaultdict[int, dict[str, typing.Counter[str]]] = defaultdict(dict)
        for scope, ops in per_scope.items():
            name = scope.rpartition("/")[2]
            _add_into(by_depth[name.count(".") + 1 if name else 0], name, ops)
        for depth in range(max(by_depth, default=0), -1, -1):
            for name, ops in by_depth[depth].items():
                totals[name] = ops  # complete: each name has one depth, and every deeper name was added
                if depth:
                    _add_into(by_depth[depth - 1], name.rpartition(".")[0], ops)
    in_model_order: dict[str, Mapping[str, float]] = {name: totals.pop(name, _NOTHING) for name in dict.fromkeys(aliases.values())}
    in_model_order.update(totals)  # names of no module (scopes the tracer made up)
    return in_model_order

def _count_per_scope(
    trace: OpSource, handles: Mapping[str, Handle], ignored: typing.Collection[str]
) -> tuple[dict[str, typing.Counter[str]], dict[str, typing.Counter[str]], list[OpCount]]:
    """Run the handles over the front end's ops; counts keyed by each op's full scope string."""
    counts: dict[str, typing.Counter[str]] = {}
    unsupported: dict[str, typing.Counter[str]] = {}
    op_counts: list[OpCount] = []
    for kind, item, handle in _handled(trace, trace.operations(), handles, ignored, unsupported):
        scope = trace.scope_of(item)
        module = scope.rpartition("/")[2]
        record = trace.record(item, kind, module)
        result = run_handle(handle, record)
        if record.phase != FORWARD:  # a backward's own recomputation (attention's scores) keeps its phase
            result = Counter({key if key.startswith(_RECOMPUTED) else f"{record.phase}.{key}": value for key, value in result.items()})
        op_counts.append(OpCount(module, kind, handle, sum(result.values()), record.phase))
        ops = counts.get(scope)
        if ops is None:
            counts[scope] = result
        else:
            ops.update(result)
    return counts, unsupported, op_counts


def _handled(
    trace: OpSource, operations: typing.Iterable[tuple[str, Any]], handles: Mapping[str, Handle], ignored: typing.Collection[str],
    unsupported: dict[str, typing.Counter[str]],
) -> Iterator[tuple[str, Any, Handle]]:
    """Each op that has a handle, with it; an op without one is counted by what it is made of, or
    noted in ``unsupported`` by scope.

    A generator of the module rather than a recursive closure: a closure that calls itself is a
    reference cycle, which kept the trace (the JIT's graph) alive until Python's cyclic collector
    ran, and its collections walk every object of the process."""
    for kind, item in operations:
        handle = handles.get(kind)
        if handle is not None:
            yield kind, item, handle
        elif kind not in ignored:
            parts = trace.parts(item)
            if parts:
                yield from _handled(trace, parts, handles, ignored, unsupported)
            else:
                unsupported.setdefault(trace.scope_of(item), Counter())[kind] += 1


def run_handle(handle: Handle, record: OpRecord) -> typing.Counter[str]:
    """The handle's count of one op, validated."""
    if not isinstance(handle, ShapeFormula) and not isinstance(record, JitOpRecord):
        raise HandleError(record.kind, record.scope, "is an fvcore-style handle (it reads JIT values): use it with backend='jit', or write it as a ShapeFormula")
    try:
        result = handle.compute(record) if isinstance(handle, ShapeFormula) else handle(*record.jit_values())
    except JitflopsError:
        raise
    except Exception as error:
        raise HandleError(record.kind, record.scope, f"raised {type(error).__name__}: {error}") from error
    return _validated(record.kind, record.scope, handle, result)
