"""The counting engine: record once, run handles over the op records, aggregate per module.

:class:`JitModelAnalysis` has fvcore's API and semantics (lazy, cached results; chainable
settings; owner/caller ancestor modes). Data flows one way: a front end (the scoped JIT trace, or
the dispatch recording) runs the model once and is kept; records are read from its ops; handles
turn records into counts per scope; counts are then summed up the module hierarchy once per
distinct scope, not once per op (those pure steps are :mod:`jitflops.engine.counting`).
"""

from __future__ import annotations

import inspect
import logging
import typing
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, Union

import torch
from torch import nn
from torch.ao.nn.quantized.modules.linear import LinearPackedParams

from .counting import OpCount, Statistics, module_aliases, statistics_of
from ..frontends.call_recording import record_calls
from ..frontends.meta_values import CALLS_COMPUTE_BELOW_WORK, CALLS_PIXELS_PER_TOKEN, computes_by_default, counted_on_meta, holds_meta
from ..frontends.dispatch_trace import WHOLE_CALLS, BackwardFn, default_backward, record_with_dispatch
from ..core.errors import JitFallbackWarning, JitflopsError
from ..frontends.program_source import ProgramSource, is_program_source
from ..handles import COMMUNICATION_FORMULAS, ELEMENTWISE_FLOP_FORMULAS, INTEGER_MAC_FORMULAS, ZERO_COST_OPS, Handle
from ..frontends.jit_fallback import USE_DISPATCH, fallback_reason, jit_tracer_available, untraceable_reason
from ..core.model_guard import collector_paused
from ..core.model_io import ModelCall
from ..core.op_source import OpSource
from ..core.process_groups import ranks_may_communicate
from ..core.records import BACKWARD, FORWARD, RECOMPUTE
from ..frontends.scoped_trace import TRACER_WARNING_MODES, ScopedTrace, trace_with_scopes, tracing_plan

if TYPE_CHECKING:
    from .symbolic_counts import DimSpec, SymbolicCount

logger = logging.getLogger(__name__)

T = TypeVar("T", bound="JitModelAnalysis")
A = TypeVar("A", bound="JitModelAnalysis")

ANCESTOR_MODES = ("owner", "caller")
BACKENDS = ("jit", "dispatch", "export")

_IGNORED_OPS: set[str] = set(ZERO_COST_OPS | ELEMENTWISE_FLOP_FORMULAS.kinds() | COMMUNICATION_FORMULAS.kinds() | INTEGER_MAC_FORMULAS.kinds())
"""Ops every new analysis ignores (counted as zero, never reported unsupported) unless a handle is set:
data movement, elementwise work, collectives (:class:`~jitflops.CommunicationAnalysis` counts their
bytes) and integer products (:class:`~jitflops.IntegerOpCountAnalysis` counts their MACs). Mutable, as fvcore's table of the same name."""

_LATER_PHASES = (BACKWARD, RECOMPUTE)
"""The phases whose counts are keyed ``<phase>.<op>``; forward counts are keyed by the op alone."""

_SHARING_A_RECORDING: ContextVar[bool] = ContextVar("jitflops_sharing_a_recording", default=False)
"""Set while an analysis is made to count from another's recording (:meth:`JitModelAnalysis.of_same_recording`):
it must not record the model itself."""


@contextmanager
def _sharing_a_recording() -> Iterator[None]:
    token = _SHARING_A_RECORDING.set(True)
    try:
        yield
    finally:
        _SHARING_A_RECORDING.reset(token)


_CONTAINER_FORWARDS = tuple(cls.forward for cls in (nn.ModuleList, nn.ModuleDict, nn.Module, nn.Identity, LinearPackedParams))
"""Forwards that are never meant to run: containers', and a quantized Linear's packed weights' (its
Linear reads them without calling the module)."""


class JitModelAnalysis:
    """Per-module, per-operator statistics of a model, from its scoped JIT trace.

    An operator belongs to a module if it ran inside that module's ``__call__`` (not an explicit
    ``module.forward(...)`` or another method: those ops go to the caller). Results are computed on
    first request and cached; changing handles recomputes them from the cached trace.

    The model is recorded at the first request, as fvcore does, except in a process that is one of
    several ranks (``torch.distributed`` initialised, world size > 1): there the forward may run
    collectives, which every rank must run together, so the model is recorded when the analysis is
    made, where every rank makes it, and reading a result on one rank (``if rank == 0:
    print(flops.total())``) runs no collective (``docs/sharded.md``).
    """

    def __init__(
        self,
        model: Union[nn.Module, ProgramSource],
        inputs: Any = None,
        kwargs: Optional[Mapping[str, Any]] = None,
        *,
        backend: str = "jit",
        backward: Union[bool, BackwardFn] = False,
        strict: bool = False,
        compute: Optional[bool] = None,
    ) -> None:
        """
        Args:
            model: the model to analyse. It is traced, never modified. Or an
                ``ExportedProgram`` or the path of a ``.pt2`` file: read by the export backend.
            inputs: the positional arguments: a tensor, a tuple of arguments (any nesting of
                tensors, lists, dicts and non-tensor values), or a mapping used as keyword arguments.
                A program may be given none: it is counted at the sizes it was exported with.
            kwargs: keyword arguments for the forward call.
            backend: ``"jit"`` (default): count from the JIT trace, as fvcore does; where the
                tracer cannot trace the model (compiled, FSDP2, DTensor or quantized models, a
                failure inside torch's tracer), the dispatch backend counts it instead, with a
                :class:`~jitflops.core.errors.JitFallbackWarning` naming the reason (:attr:`counted_by`
                says which front end counted). ``"dispatch"``: record the aten ops the model runs
                eagerly; follows data-dependent control flow, any output, ``torch.compile``d models,
                and the backward pass. ``"export"``: read the graph ``torch.export`` makes (strict=False)
                statically, nothing run (:mod:`jitflops.frontends.export_trace`). Where torch has no JIT tracer,
                ``"jit"`` exports, and where export fails, the dispatch backend counts, with a warning.
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
        self._program: Optional["torch.export.ExportedProgram"] = None
        if is_program_source(model):
            if backend == "dispatch":
                raise ValueError("an exported program is read by backend='export' (the dispatch backend runs a model)")
            from ..frontends.export_trace import module_of, program_of  # sympy: only for a program (program_source.py)

            backend, self._program = "export", program_of(model)
            model = module_of(self._program)
        elif inputs is None:
            raise TypeError(f"inputs are required to analyse a {type(model).__name__} (only an exported program may be given none)")
        self._sized_by_call = inputs is not None
        if backward and backend != "dispatch":
            raise ValueError("counting the backward pass needs backend='dispatch' (a JIT trace holds the forward only)")
        self._given_model = model
        """The model given (an exported program's modules); :attr:`_model` is what is counted."""
        self._inputs = inputs
        self._kwargs = kwargs
        self._backend = backend
        self._backward: Optional[BackwardFn] = (default_backward if backward is True else backward) or None
        self._strict = strict
        self._compute = compute
        self._given_call = ModelCall.from_user(() if inputs is None else inputs, kwargs)
        """The call as given; analyses of the same one share a recording (:meth:`share_trace`)."""
        self._model, self._call = counted_on_meta(model, self._given_call)
        model = self._model
        self._named_modules: dict[str, nn.Module] = dict(model.named_modules(remove_duplicate=False))
        self._aliases = module_aliases(model, self._named_modules)
        self._op_handles: dict[str, Handle] = {}
        self._ignored_ops: set[str] = set(self._default_ignored_ops())
        self._trace: Optional[OpSource] = None
        self._calls: Optional[OpSource] = None
        """The JIT trace's records read from the model's calls, where the last count was taken from
        them instead of a trace (:meth:`_recorded_calls`)."""
        self._fallback: Optional[str] = None
        self._counted_by: Optional[str] = None
        self._stats: Optional[Statistics] = None
        self._warnings_emitted = False
        self.unsupported_ops_warnings(True)
        self.uncalled_modules_warnings(True)
        self.tracer_warnings("no_tracer_warning")
        self.ancestor_mode("owner")
        self.set_op_handle(**self._default_handles())
        if ranks_may_communicate() and not _SHARING_A_RECORDING.get():
            self.scoped_trace()

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

    def formula(self, **dims: DimSpec) -> SymbolicCount:
        """The statistic as exact expressions of named input sizes, per module: ``formula(b=0, s=1)``
        makes dimension 0 of every input tensor the symbol ``b`` and dimension 1 ``s``; a tuple binds
        several dimensions (``size=(2, 3)``), a mapping per input (``t={"decoder_input_ids": 1}``).
        The model runs once on fake tensors of those symbolic sizes, recorded by the dispatch
        backend, under this analysis' handles (:mod:`jitflops.engine.symbolic_counts`). With the export
        backend, the program's own size symbols are read instead, nothing run: a program exported
        with dynamic shapes needs no ``dims`` (its symbols keep their names where none is given);
        a model is exported with the named dimensions dynamic."""
        from .symbolic_counts import dynamic_dims, program_formula, symbolic_count  # both import sympy: only for a formula (program_source.py)
        from ..frontends.export_trace import export_model

        if self._backend != "export":
            return symbolic_count(self._model, self._call, self._aliases, self._op_handles, self._ignored_ops, self._ancestor_mode, dims)
        program, inner = (self._program, "") if self._program is not None else export_model(self._model, self._call, dynamic_dims(self._call, dims))
        return program_formula(program, self._call if self._sized_by_call else None, self._aliases, self._op_handles, self._ignored_ops, self._ancestor_mode, dims, inner)

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
        return type(self)(self._subject if model is self._model else model, inputs, kwargs, **self._front_end_settings())

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

    def of_same_recording(self, cls: type[A], **settings: Any) -> A:
        """An analysis of class ``cls`` (with ``settings``) of this call, counted from this one's
        recording, its warnings left to this one: another statistic of the same run."""
        with _sharing_a_recording():
            other = cls(self._subject, self._inputs, self._kwargs, **settings, **self._front_end_settings())
        return other.share_trace(self).unsupported_ops_warnings(False).uncalled_modules_warnings(False)

    def share_trace(self: T, other: "JitModelAnalysis") -> T:
        """Count from ``other``'s trace instead of tracing again (both must analyse the same call)."""
        if other._given_model is not self._given_model or not other._given_call.is_same_call(self._given_call) or other._front_end_settings() != self._front_end_settings():
            raise ValueError("share_trace needs an analysis of the same model and inputs, with the same backend")
        self._trace = other.scoped_trace()
        self._fallback, self._counted_by = other._fallback, other._counted_by
        self._stats = None
        return self

    @property
    def _subject(self) -> Union[nn.Module, "torch.export.ExportedProgram"]:
        """What was given to analyse: the model, or the exported program."""
        return self._program if self._program is not None else self._given_model

    @property
    def backend(self) -> str:
        """The front end asked for: ``"jit"``, ``"dispatch"`` or ``"export"`` (:attr:`counted_by` is the one that counted)."""
        return self._backend

    @property
    def counted_by(self) -> str:
        """The front end that recorded the ops: the one asked for, or the JIT's fallback
        (``"dispatch"``; ``"export"`` where torch has no JIT tracer): :attr:`fallback_reason`
        says why. Records the model on first use (a count read from the model's calls is the JIT's, no trace taken)."""
        self._recorded()
        return self._counted_by or self._backend

    @property
    def fallback_reason(self) -> Optional[str]:
        """Why another front end counted a model the JIT was asked to (None: it did not)."""
        self._recorded()
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
        before tracing, the dispatch backend records it (:mod:`jitflops.frontends.jit_fallback`)."""
        if self._backend == "export":
            return self._record_exported, ()
        if self._backend == "jit":
            if not jit_tracer_available() and self._may_fall_back():
                self._falling_back(f"torch {torch.__version__} has no JIT tracer", "export")
                return self._record_exported, ()
            reason = untraceable_reason(self._model, self._call)
            if reason is None:
                return tracing_plan(self._model, self._call, self._aliases, self._strict, True, self._compute)
            if not self._may_fall_back():
                raise JitflopsError(f"{reason}: {USE_DISPATCH}")
            self._falling_back(reason)
        return self._record_with_dispatch, (self._model, self._call, self._aliases, self._backward)

    def _record_exported(self) -> OpSource:
        """The export backend's recording: the program given, or the model exported (strict=False)."""
        from ..frontends.export_trace import export_model, record_program  # sympy: only for a program (program_source.py)

        program, inner = (self._program, "") if self._program is not None else export_model(self._model, self._call)
        return record_program(program, self._aliases, self._call if self._sized_by_call else None, inner)

    def _record_with_dispatch(self, model: nn.Module, call: ModelCall, aliases: Mapping[Any, str], backward: Optional[BackwardFn]) -> OpSource:
        """The dispatch backend's recording; the composite calls :meth:`_whole_calls` names recorded
        whole, and on the meta device the calls a device runs whole where meta tensors take their
        math path (:data:`~jitflops.frontends.dispatch_trace.WHOLE_CALLS`: attention), run by the
        kernel the CPU would choose for each, forward and backward, as the CPU's recording has them."""
        on_meta = holds_meta(list(model.parameters()), call)
        whole = self._whole_calls() or (WHOLE_CALLS if on_meta else ())
        return record_with_dispatch(model, call, aliases, backward, whole=whole, count_bytecode=self._counts_bytecode())

    @classmethod
    def _counts_bytecode(cls) -> bool:
        """Whether the dispatch backend counts the model's Python bytecode between ops
        (:mod:`jitflops.frontends.bytecode_count`): not for a count."""
        return False

    @classmethod
    def _whole_calls(cls) -> tuple[str, ...]:
        """Composite ops the dispatch backend records where Python calls them, beyond its own
        (:data:`~jitflops.frontends.dispatch_trace.FUNCTION_LEVEL_KINDS`): none for a count."""
        return ()

    def _may_fall_back(self) -> bool:
        return self._backend == "jit" and not self._strict and self._compute is not False

    def _falling_back(self, reason: str, front_end: str = "dispatch") -> None:
        self._fallback, self._counted_by = reason, front_end
        how = {"dispatch": "recording the ops as they run", "export": "reading the graph torch.export makes"}[front_end]
        warnings.warn(
            f"jitflops: {reason}; the {front_end} backend counts it instead, {how} "
            f"(backend='{front_end}' asks for it, strict=True raises instead)",
            JitFallbackWarning,
            stacklevel=4,
        )

    def _recorded_after(self, error: Exception) -> OpSource:
        """The dispatch backend's recording where the JIT's trace failed with ``error``, if the fallback
        is allowed and the model's forward runs; ``error`` otherwise (it names the module at fault)."""
        if not self._may_fall_back() or self._program is not None:
            raise error
        try:
            trace = self._record_with_dispatch(self._model, self._call, self._aliases, None)
        except Exception:
            raise error  # the model fails eagerly too: the trace's error says where
        exported = self._counted_by == "export"
        self._falling_back(f"{self._fallback} and torch.export failed: {str(error).splitlines()[0]}" if exported else fallback_reason(error))
        return trace

    def _results(self, emit_warnings: bool = True) -> Statistics:
        if self._stats is None:
            with collector_paused():
                if self._trace is None:  # recorded again for each new count: the calls taken depend on the handles
                    self._calls = self._recorded_calls()
                if self._trace is None and self._calls is None:
                    front_end, arguments = self._front_end()
                    try:
                        self._trace = front_end(*arguments)
                    except Exception as error:
                        self._trace = self._recorded_after(error)
                if self._trace is not None:
                    self._trace.replay_warnings(self._warn_trace)
                self._stats = self._analyze(self._recording())
            self._warnings_emitted = False
        if emit_warnings and not self._warnings_emitted:
            self._warnings_emitted = True
            self._warn_unsupported_ops(self._stats.unsupported_ops.get("", Counter()))
            self._warn_uncalled_mods(self._stats.uncalled_mods)
            self._warn_left_out()
        return self._stats

    def _analyze(self, trace: OpSource) -> Statistics:
        return statistics_of(trace, self._op_handles, self._ignored_ops, self._aliases, self._ancestor_mode)

    def _counts_calls(self) -> bool:
        """Whether this analysis may count from the model's calls instead of a trace, with the same
        records (:mod:`jitflops.frontends.call_recording`): a subclass says which may; only a JIT count
        that may run on values without data, whose tracer warnings are not asked for."""
        return False

    def _recorded_calls(self) -> Optional[OpSource]:
        """The JIT trace's records read from the model's calls, where this count may take them
        (:meth:`_counts_calls`) and the model's calls allow it; None: the JIT traces it."""
        if not (
            self._counts_calls() and self._backend == "jit" and self._compute is not True and self._warn_trace == "no_tracer_warning"
            and jit_tracer_available() and untraceable_reason(self._model, self._call) is None
        ):
            return None
        parameters = list(self._model.parameters())
        on_values = self._compute is None and computes_by_default(self._model, parameters, self._call, CALLS_COMPUTE_BELOW_WORK, CALLS_PIXELS_PER_TOKEN)
        on_meta_copy = not on_values and not holds_meta(parameters, self._call)  # a model on the meta device runs as it is
        return record_calls(self._model, self._call, self._aliases, self._op_handles, self._ignored_ops, on_meta_copy)

    def _recorded(self) -> None:
        """Record the model if no count has read it yet (a count read from its calls is the JIT's:
        no trace is taken to say which front end counted)."""
        if self._trace is None and self._calls is None:
            self.scoped_trace()

    def _recording(self) -> OpSource:
        """What the counts were read from: the trace, or the calls where no trace was taken."""
        return self._calls if self._trace is None and self._calls is not None else self.scoped_trace()

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

    def _warn_left_out(self) -> None:
        """Warn of work this statistic leaves to another analysis (none here: a subclass says)."""

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


__all__ = ["ANCESTOR_MODES", "BACKENDS", "JitModelAnalysis", "OpCount", "Statistics", "module_aliases", "per_operator_in_units"]
