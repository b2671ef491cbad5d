"""The counting engine: record once, run handles over the op records, aggregate per module.

:class:`JitModelAnalysis` has fvcore's API and semantics (lazy, cached results; chainable
settings; owner/caller ancestor modes). Data flows one way: a front end (the scoped JIT trace, or
the dispatch recording) runs the model once and is kept; records are read from its ops; handles
turn records into counts per scope; counts are then summed up the module hierarchy once per
distinct scope, not once per op.
"""

from __future__ import annotations

import inspect
import logging
import math
import typing
import warnings
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Number, Real
from types import MappingProxyType
from typing import Any, Callable, NamedTuple, Optional, TypeVar, Union

import torch
from torch import nn

from .dispatch_trace import BackwardFn, default_backward, record_with_dispatch
from .errors import HandleError, JitFallbackWarning, JitflopsError
from .handles import ELEMENTWISE_FLOP_FORMULAS, ZERO_COST_OPS, Handle, ShapeFormula
from .handles.registry import as_counter
from .jit_fallback import USE_DISPATCH, fallback_reason, untraceable_reason
from .model_guard import collector_paused
from .model_io import ModelCall
from .op_source import OpSource
from .records import BACKWARD, FORWARD, RECOMPUTE, JitOpRecord, OpRecord
from .scoped_trace import TRACER_WARNING_MODES, ScopedTrace, trace_with_scopes, tracing_plan

logger = logging.getLogger(__name__)

T = TypeVar("T", bound="JitModelAnalysis")

ANCESTOR_MODES = ("owner", "caller")
BACKENDS = ("jit", "dispatch")

_IGNORED_OPS: set[str] = set(ZERO_COST_OPS | ELEMENTWISE_FLOP_FORMULAS.kinds())
"""Ops every new analysis ignores (counted as zero, never reported unsupported) unless a handle is set:
data movement and elementwise work. Mutable, as fvcore's table of the same name."""

_LATER_PHASES = (BACKWARD, RECOMPUTE)
"""The phases whose counts are keyed ``<phase>.<op>``; forward counts are keyed by the op alone."""

_CONTAINER_FORWARDS = tuple(cls.forward for cls in (nn.ModuleList, nn.ModuleDict, nn.Module, nn.Identity))


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
        totals[name] = Counter(ops)
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


class JitModelAnalysis:
    """Per-module, per-operator statistics of a model, from its scoped JIT trace.

    An operator belongs to a module if it ran inside that module's ``__call__`` (not an explicit
    ``module.forward(...)`` or another method: those ops go to the caller). Results are computed on
    first request and cached; changing handles recomputes them from the cached trace.
    """

    def __init__(
        self,
        model: nn.Module,
        inputs: Any,
        kwargs: Optional[Mapping[str, Any]] = None,
        *,
        backend: str = "jit",
        backward: Union[bool, BackwardFn] = False,
        strict: bool = False,
        compute: Optional[bool] = None,
    ) -> None:
        """
        Args:
            model: the model to analyse. It is traced, never modified.
            inputs: the positional arguments: a tensor, a tuple of arguments (any nesting of
                tensors, lists, dicts and non-tensor values), or a mapping used as keyword arguments.
            kwargs: keyword arguments for the forward call.
            backend: ``"jit"`` (default): count from the JIT trace, as fvcore does; where the
                tracer cannot trace the model (compiled, FSDP2, DTensor or quantized models, a
                failure inside torch's tracer), the dispatch backend counts it instead, with a
                :class:`~jitflops.errors.JitFallbackWarning` naming the reason (:attr:`counted_by`
                says which front end counted). ``"dispatch"``: record the aten ops the model runs
                eagerly; follows data-dependent control flow, any output, ``torch.compile``d models,
                and the backward pass.
            backward: with the dispatch backend, also run and count the backward pass: ``True``
                backpropagates from the sum of the model's floating-point outputs; a callable
                receives the model's output and runs its own backward. Backward ops are counted
                under ``backward.<op>`` keys, and the forward that activation checkpointing
                recomputes in the backward under ``recompute.<op>``, so ``by_phase()`` tells the
                phases apart.
            strict: with the JIT backend, raise a ``TraceError`` where Python control flow depends on
                tensor values, and raise where the tracer cannot trace the model instead of counting
                it with the dispatch backend. By default, as in fvcore, the path the inputs took is
                counted and a ``DataDependentTraceWarning`` names the module and source line.
            compute: with the JIT backend, whether the trace computes on the real values: ``None``
                (default) traces on values without data (``meta``) where that is cheaper (all but
                small calls) and falls back to real values where the model needs them; ``True``
                always computes; ``False`` never does (and raises where the model needs values,
                or where the tracer cannot trace it). The counts are the same.
        """
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backward and backend != "dispatch":
            raise ValueError("counting the backward pass needs backend='dispatch' (a JIT trace holds the forward only)")
        self._model = model
        self._inputs = inputs
        self._kwargs = kwargs
        self._backend = backend
        self._backward: Optional[BackwardFn] = (default_backward if backward is True else backward) or None
        self._strict = strict
        self._compute = compute
        self._call = ModelCall.from_user(inputs, kwargs)
        self._named_modules: dict[str, nn.Module] = dict(model.named_modules(remove_duplicate=False))
        self._aliases = module_aliases(model, self._named_modules)
        self._op_handles: dict[str, Handle] = {}
        self._ignored_ops: set[str] = set(self._default_ignored_ops())
        self._trace: Optional[OpSource] = None
        self._fallback: Optional[str] = None
        self._stats: Optional[Statistics] = None
        self._warnings_emitted = False
        self.unsupported_ops_warnings(True)
        self.uncalled_modules_warnings(True)
        self.tracer_warnings("no_tracer_warning")
        self.ancestor_mode("owner")
        self.set_op_handle(**self._default_handles())

    @classmethod
    def _default_handles(cls) -> Mapping[str, Handle]:
        """The handles a new analysis of this class starts with (read when it is made: fvcore's
        mutable ``_DEFAULT_SUPPORTED_OPS`` tables in the subclasses)."""
        return {}

    @classmethod
    def _default_ignored_ops(cls) -> frozenset[str]:
        """Ops known to cost nothing under the default convention (:data:`_IGNORED_OPS`)."""
        return frozenset(_IGNORED_OPS)

    # ----------------------------------------------------------------- results

    def total(self, module_name: str = "") -> int:
        """The statistic summed over all operators of ``module_name`` (default: the whole model)."""
        return sum(self._results().counts[self.canonical_module_name(module_name)].values())

    def by_operator(self, module_name: str = "") -> typing.Counter[str]:
        """The statistic of ``module_name`` per operator."""
        return Counter(self._results().counts[self.canonical_module_name(module_name)])

    def by_module_and_operator(self) -> dict[str, typing.Counter[str]]:
        """The statistic per module (canonical names), then per operator."""
        return {name: Counter(ops) for name, ops in self._results().counts.items()}

    def by_phase(self, module_name: str = "") -> typing.Counter[str]:
        """The statistic of ``module_name`` split into ``forward``, ``backward`` and ``recompute`` (the
        forward activation checkpointing runs again in the backward), as the dispatch backend records them."""
        phases: typing.Counter[str] = Counter()
        for op, value in self._results().counts[self.canonical_module_name(module_name)].items():
            phase = op.partition(".")[0]
            phases[phase if phase in _LATER_PHASES else FORWARD] += value
        return phases

    def by_module(self, emit_warnings: bool = True) -> typing.Counter[str]:
        """The statistic per module, summed over operators.

        ``emit_warnings=False`` is for printers: it leaves the unsupported-op and uncalled-module
        warnings to the next call that asks for them.
        """
        return Counter({name: sum(ops.values()) for name, ops in self._results(emit_warnings).counts.items()})

    def op_counts(self) -> tuple[OpCount, ...]:
        """The count of every counted op call, in execution order, with its innermost module."""
        return self._results(emit_warnings=False).op_counts

    def output_shapes(self) -> dict[str, list[tuple[int, ...]]]:
        """The shapes of the tensors each module returned (its canonical name: a list, one shape per
        returned tensor), read from the JIT trace, as torchinfo shows them."""
        trace = self.scoped_trace()
        if not isinstance(trace, ScopedTrace):
            raise JitflopsError("output shapes are read from the JIT trace: use backend='jit'")
        return trace.module_output_shapes()

    def unsupported_ops(self, module_name: str = "") -> typing.Counter[str]:
        """Ops met in ``module_name`` that have no handle and are not known to cost nothing."""
        return Counter(self._results().unsupported_ops[self.canonical_module_name(module_name)])

    def uncalled_modules(self, emit_warnings: bool = True) -> set[str]:
        """Submodules whose ``__call__`` never ran: unused, or run via ``.forward()`` or another method."""
        return set(self._results(emit_warnings).uncalled_mods)

    # ---------------------------------------------------------------- settings

    def set_op_handle(self: T, *args: Any, **kwargs: Optional[Handle]) -> T:
        """Set handles: ``set_op_handle("aten::foo", handle, "aten::bar", None, **more)``.

        A ``None`` handle ignores the op (counted as zero, never unsupported). A handle is a
        :class:`~jitflops.handles.ShapeFormula` or an fvcore-style callable taking the op's JIT
        input and output values and returning a number or a Counter.
        """
        if len(args) % 2 != 0:
            raise TypeError("set_op_handle should be called with pairs of names and handles!")
        self._stats = None
        pairs = list(zip(args[::2], args[1::2])) + list(kwargs.items())
        for name, handle in pairs:
            if handle is None:
                self._ignored_ops.add(name)
                self._op_handles.pop(name, None)
            elif callable(handle):
                self._op_handles[name] = handle
                self._ignored_ops.discard(name)
            else:
                raise TypeError(f"handle for {name} must be callable or None, got {type(handle).__name__}")
        return self

    def clear_op_handles(self: T) -> T:
        """Remove every handle, and forget ops ignored with ``set_op_handle(name, None)``."""
        self._op_handles = {}
        self._ignored_ops = set(self._default_ignored_ops())
        self._stats = None
        return self

    def canonical_module_name(self, name: str) -> str:
        """The name results use for the module called ``name`` (shared modules have several names)."""
        if not isinstance(name, str):
            raise TypeError(f"Module name must be a string, got {type(name).__name__}.")
        try:
            return self._aliases[name]
        except KeyError:
            raise KeyError(f"Requested module name {name!r} is not among the descendants of the analyzed model.") from None

    def copy(self: T, new_model: Optional[nn.Module] = None, new_inputs: Any = None) -> T:
        """A new analysis with every setting of this one, on a new model and/or new inputs."""
        model = self._model if new_model is None else new_model
        inputs, kwargs = (self._inputs, self._kwargs) if new_inputs is None else (new_inputs, None)
        other = self._new_like(model, inputs, kwargs)
        other._op_handles = dict(self._op_handles)
        other._ignored_ops = set(self._ignored_ops)
        return (
            other.unsupported_ops_warnings(self._enable_warn_unsupported_ops)
            .uncalled_modules_warnings(self._enable_warn_uncalled_mods)
            .tracer_warnings(self._warn_trace)
            .ancestor_mode(self._ancestor_mode)
        )

    def _new_like(self: T, model: nn.Module, inputs: Any, kwargs: Optional[Mapping[str, Any]]) -> T:
        """A fresh analysis of this class; subclasses with extra constructor settings override it."""
        return type(self)(model, inputs, kwargs, **self._front_end_settings())

    def _front_end_settings(self) -> dict[str, Any]:
        return {"backend": self._backend, "backward": self._backward or False, "strict": self._strict, "compute": self._compute}

    def tracer_warnings(self: T, mode: str) -> T:
        """Which warnings to show while tracing: ``"all"``, ``"no_tracer_warning"`` (default) or ``"none"``."""
        if mode not in TRACER_WARNING_MODES:
            raise ValueError(f"Unrecognized tracer warning mode {mode}.")
        self._warn_trace = mode
        return self

    def ancestor_mode(self: T, mode: str) -> T:
        """How an op's modules are found: ``"owner"`` (default) or ``"caller"``.

        * ``"owner"``: the innermost running module and its parents by ownership (name prefixes).
        * ``"caller"``: every module whose ``forward`` was running when the op ran.
        """
        if mode not in ANCESTOR_MODES:
            raise ValueError(f"Unrecognized ancestor mode: {mode}")
        if getattr(self, "_ancestor_mode", mode) != mode:
            self._stats = None
        self._ancestor_mode = mode
        return self

    def unsupported_ops_warnings(self: T, enabled: bool) -> T:
        """Whether to log ops that have no handle. :meth:`unsupported_ops` lists them either way."""
        self._enable_warn_unsupported_ops = enabled
        return self

    def uncalled_modules_warnings(self: T, enabled: bool) -> T:
        """Whether to log submodules that were never called. :meth:`uncalled_modules` lists them either way."""
        self._enable_warn_uncalled_mods = enabled
        return self

    # ------------------------------------------------------------------ engine

    def share_trace(self: T, other: "JitModelAnalysis") -> T:
        """Count from ``other``'s trace instead of tracing again (both must analyse the same call)."""
        if other._model is not self._model or not other._call.is_same_call(self._call) or other._front_end_settings() != self._front_end_settings():
            raise ValueError("share_trace needs an analysis of the same model and inputs, with the same backend")
        self._trace = other.scoped_trace()
        self._fallback = other._fallback
        self._stats = None
        return self

    @property
    def backend(self) -> str:
        """The front end asked for: ``"jit"`` or ``"dispatch"`` (:attr:`counted_by` is the one that counted)."""
        return self._backend

    @property
    def counted_by(self) -> str:
        """The front end that recorded the ops: ``"jit"``, or ``"dispatch"`` (asked for, or the JIT's
        fallback: :attr:`fallback_reason` says why). Records the model on first use."""
        self.scoped_trace()
        return "dispatch" if self._backend == "dispatch" or self._fallback is not None else "jit"

    @property
    def fallback_reason(self) -> Optional[str]:
        """Why the dispatch backend counted a model the JIT was asked to (None: it did not)."""
        self.scoped_trace()
        return self._fallback

    def scoped_trace(self) -> OpSource:
        """The model's ops with their scopes (a JIT trace or a dispatch recording), taken on first use and kept."""
        if self._trace is None:
            front_end, arguments = self._front_end()
            try:
                self._trace = front_end(*arguments)
            except Exception as error:
                self._trace = self._recorded_after(error)
        return self._trace

    def _front_end(self) -> tuple[Callable[..., OpSource], tuple[Any, ...]]:
        """The function that records the model's ops, and its arguments: called by the method that
        needs the recording, not from a helper, since the tracer walks every frame above it per node
        (about 1% of a MobileNetV2 trace per frame). Where the JIT cannot trace the model, known
        before tracing, the dispatch backend records it (:mod:`jitflops.jit_fallback`)."""
        if self._backend == "jit":
            reason = untraceable_reason(self._model, self._call)
            if reason is None:
                return tracing_plan(self._model, self._call, self._aliases, self._strict, True, self._compute)
            if not self._may_fall_back():
                raise JitflopsError(f"{reason}: {USE_DISPATCH}")
            self._falling_back(reason)
        return record_with_dispatch, (self._model, self._call, self._aliases, self._backward)

    def _may_fall_back(self) -> bool:
        return self._backend == "jit" and not self._strict and self._compute is not False

    def _falling_back(self, reason: str) -> None:
        self._fallback = reason
        warnings.warn(
            f"jitflops: {reason}; the dispatch backend counts it instead, recording the ops as they run "
            f"(backend='dispatch' asks for it, strict=True raises instead)",
            JitFallbackWarning,
            stacklevel=4,
        )

    def _recorded_after(self, error: Exception) -> OpSource:
        """The dispatch backend's recording where the JIT's trace failed with ``error``, if the fallback
        is allowed and the model's forward runs; ``error`` otherwise (it names the module at fault)."""
        if not self._may_fall_back():
            raise error
        try:
            trace = record_with_dispatch(self._model, self._call, self._aliases, None)
        except Exception:
            raise error  # the model fails eagerly too: the trace's error says where
        self._falling_back(fallback_reason(error))
        return trace

    def _results(self, emit_warnings: bool = True) -> Statistics:
        if self._stats is None:
            with collector_paused():
                if self._trace is None:
                    front_end, arguments = self._front_end()
                    try:
                        self._trace = front_end(*arguments)
                    except Exception as error:
                        self._trace = self._recorded_after(error)
                self._trace.replay_warnings(self._warn_trace)
                self._stats = self._analyze(self._trace)
            self._warnings_emitted = False
        if emit_warnings and not self._warnings_emitted:
            self._warnings_emitted = True
            self._warn_unsupported_ops(self._stats.unsupported_ops.get("", Counter()))
            self._warn_uncalled_mods(self._stats.uncalled_mods)
        return self._stats

    def _analyze(self, trace: OpSource) -> Statistics:
        scope_counts, scope_unsupported, op_counts = self._count_per_scope(trace)
        seen: set[str] = set()
        innermost: set[str] = set()
        for scope in trace.scopes():  # a module is called if an op ran in its scope (fvcore's rule)
            seen.update(scope.split("/"))
            innermost.add(scope.rpartition("/")[2])
        if self._ancestor_mode == "owner":  # and so are its owners
            seen |= _with_name_prefixes(innermost)
        uncalled = frozenset(set(self._aliases.values()) - seen)
        return Statistics(self._per_module(scope_counts), self._per_module(scope_unsupported), uncalled, tuple(op_counts))

    def _per_module(self, per_scope: dict[str, typing.Counter[str]]) -> dict[str, Mapping[str, float]]:
        """Sum counts keyed by full scope into every module they belong to, by the ancestor mode;
        every module of the model gets an entry, in the model's order."""
        totals: dict[str, typing.Counter[str]] = {}
        if self._ancestor_mode == "caller":
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
        in_model_order: dict[str, Mapping[str, float]] = {name: totals.pop(name, _NOTHING) for name in dict.fromkeys(self._aliases.values())}
        in_model_order.update(totals)  # names of no module (scopes the tracer made up)
        return in_model_order

    def _count_per_scope(
        self, trace: OpSource
    ) -> tuple[dict[str, typing.Counter[str]], dict[str, typing.Counter[str]], list[OpCount]]:
        """Run the handles over the front end's ops; counts keyed by each op's full scope string."""
        handles, ignored = self._op_handles, self._ignored_ops
        counts: dict[str, typing.Counter[str]] = {}
        unsupported: dict[str, typing.Counter[str]] = {}
        op_counts: list[OpCount] = []

        def count(operations: typing.Iterable[tuple[str, Any]]) -> None:
            for kind, item in operations:
                handle = handles.get(kind)
                if handle is None:
                    if kind not in ignored:
                        parts = trace.parts(item)  # an op without a handle is counted by what it is made of
                        if parts:
                            count(parts)
                        else:
                            unsupported.setdefault(trace.scope_of(item), Counter())[kind] += 1
                    continue
                scope = trace.scope_of(item)
                module = scope.rpartition("/")[2]
                record = trace.record(item, kind, module)
                result = self._run_handle(handle, record)
                if record.phase != FORWARD:
                    result = Counter({f"{record.phase}.{key}": value for key, value in result.items()})
                op_counts.append(OpCount(module, kind, handle, sum(result.values()), record.phase))
                ops = counts.get(scope)
                if ops is None:
                    counts[scope] = result
                else:
                    ops.update(result)

        count(trace.operations())
        return counts, unsupported, op_counts

    @staticmethod
    def _run_handle(handle: Handle, record: OpRecord) -> typing.Counter[str]:
        if not isinstance(handle, ShapeFormula) and not isinstance(record, JitOpRecord):
            raise HandleError(record.kind, record.scope, "is an fvcore-style handle (it reads JIT values): use it with backend='jit', or write it as a ShapeFormula")
        try:
            result = handle.compute(record) if isinstance(handle, ShapeFormula) else handle(*record.jit_values())
        except JitflopsError:
            raise
        except Exception as error:
            raise HandleError(record.kind, record.scope, f"raised {type(error).__name__}: {error}") from error
        return _validated(record.kind, record.scope, handle, result)

    # ---------------------------------------------------------------- warnings

    def _warn_unsupported_ops(self, ops: typing.Counter[str]) -> None:
        """One warning per op, in fvcore's words, so that log filters written for fvcore keep working."""
        if not self._enable_warn_unsupported_ops:
            return
        for op, count in sorted(ops.items()):
            logger.warning("Unsupported operator %s encountered %d time(s)", op, count)

    def _warn_uncalled_mods(self, uncalled: frozenset[str]) -> None:
        if not self._enable_warn_uncalled_mods:
            return
        reported = sorted(name for name in uncalled if self._has_forward(name))
        if reported:
            logger.warning(
                "The following submodules of the model were never called during the trace of the graph. "
                "They may be unused, or they were accessed by direct calls to .forward() or via other "
                "python methods. In the latter case they will have zeros for statistics, though their "
                "statistics will still contribute to their parent calling module.\n%s",
                ", ".join(reported),
            )

    def _has_forward(self, name: str) -> bool:
        module = self._named_modules.get(name)
        # looked up without running descriptors: a scripted module's ``forward`` is one that fails on its class
        return module is not None and inspect.getattr_static(type(module), "forward") not in _CONTAINER_FORWARDS


def per_operator_in_units(analysis: JitModelAnalysis, unit: float) -> tuple[typing.DefaultDict[str, float], typing.Counter[str]]:
    """The whole model's statistic per operator divided by ``unit``, and its unsupported ops:
    what fvcore's functional forms ``flop_count`` and ``activation_count`` return."""
    scaled: typing.DefaultDict[str, float] = defaultdict(float)
    for op, value in analysis.by_operator().items():
        scaled[op] = value / unit
    return scaled, analysis.unsupported_ops()


def _get_scoped_trace_graph(module: nn.Module, inputs: Any, aliases: Mapping[Any, str]) -> "torch._C.Graph":
    """fvcore's helper: the traced graph of ``module(*inputs)`` whose nodes carry their module scope
    in ``node.scopeName()`` (``aliases`` maps modules to the names used), as fvcore's reads."""
    return trace_with_scopes(module, ModelCall.from_user(inputs), aliases, scope_boundaries=False).graph
