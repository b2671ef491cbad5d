"""Trace a model's aten graph with the module scope of every node.

While tracing, ``nn.Module.__call__`` calls the tracer's ``push_scope``/``pop_scope`` for each
module listed in torch's ``torch.jit._trace._trace_module_map`` (the mechanism
``torch.jit.trace_module`` and the ONNX exporter use). jitflops fills that map with the canonical
module names for the duration of the trace, and puts back what was there before.

Three costs are avoided, all measured with ``tools/bench.py`` and py-spy:

* Forward hooks (fvcore's way to push scopes) make ``nn.Module.__call__`` take its slow path, which
  adds a Python frame at every module level; the tracer walks the whole Python stack for every node
  it records, so deeper stacks cost up to 20% of the trace. The map adds no frame, and while the
  model runs in the trace, a module's call goes straight to its ``forward`` between the scope
  boundaries (one frame where ``nn.Module``'s call machinery takes three more per level).
* The tracer's own ``push_scope`` opens a nested block per module call, and torch inlines those
  blocks after the trace, cloning every node once per nesting level (10-20% of the trace on deep
  models). For the duration of the trace, this trace's ``TracingState`` object instead gets
  ``push_scope``/``pop_scope`` attributes that shadow those methods and note the graph's last node
  at each call (a boundary: one call into the JIT, no node added). At the end of the model's call,
  still inside the trace, one pass over the flat graph gives each node its scope from those
  boundaries, before the tracer's clean-up removes the dead nodes a boundary may name. A node
  belongs to the module whose boundaries enclose it; the one place this differs from the tracer's
  own scopes is the free ``aten::Int`` conversion of a traced size, which the tracer places right
  after the size op (in the module that took the size) while scoping it to the module that used it.
* ``torch.jit._get_trace_graph`` reaches the C++ tracer through a wrapper module, four more frames
  for the tracer to walk per node: :func:`_tracer_call` gives the tracer the wrapper's call itself.

Without hooks, the module that was running when something failed is found from the exception's
traceback instead. What runs inside the trace (the boundaries, and the pass that reads them) is
:mod:`jitflops.frontends.scope_boundaries`; the check for control flow that depends on the inputs' values,
:mod:`jitflops.frontends.data_dependence`.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import torch
import torch.jit._trace as jit_trace
from torch import nn
from torch.jit import TracerWarning

from .data_dependence import TraceWarnings
from ..core.errors import DataDependentTraceWarning, JitflopsError, TraceError, describe_scope
from .meta_values import READS_A_VALUE, computes_by_default, meta_kernels_for_tracing, empty_copy, holds_meta, lost_values, meta_blocker, reads_a_meta_value
from .jit_fallback import USE_DISPATCH
from ..core.imported_classes import is_compiled
from ..core.model_guard import preserved
from ..core.model_io import FlatCall, ModelCall
from ..core.records import JitOpRecord, OpRecord
from ..core.running_module import failures_named, module_names
from .traced_path import on_the_traced_path
from .scope_boundaries import KEEP_ALIVE, NodeScopes, ScopeBoundaries, full_scope, prim_op_kind, recording

logger = logging.getLogger(__name__)

TRACER_WARNING_MODES = ("all", "no_tracer_warning", "none")

_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel)


TracedOp = tuple["torch._C.Node", str]
"""An op node of the graph and its full scope."""

@dataclass(frozen=True)
class ScopedTrace:
    """A traced graph whose op nodes know their module scope: an op source for the engine.

    ``operations()`` yields ``(kind, (node, scope))`` for every op node (graph bookkeeping, the
    ``prim::`` nodes other than Python ops and calls, is skipped); ``record`` is only asked for the
    nodes the engine counts, so the rest cost next to nothing.
    """

    graph: "torch._C.Graph"
    ops: tuple[tuple[str, TracedOp], ...]
    distinct_scopes: tuple[str, ...]
    caught: tuple[warnings.WarningMessage, ...] = ()
    """The warnings raised while tracing, shown again each time the trace is counted."""

    @classmethod
    def read(cls, graph: "torch._C.Graph", read_in_trace: NodeScopes, caught: Sequence[warnings.WarningMessage] = ()) -> "ScopedTrace":
        """The op nodes of a finished trace with their scopes: as read inside the trace
        (:func:`read_in_trace`), or from the tracer's own scope for nodes that pass did not see
        (made by the tracer's clean-up, or the tracer kept its own scopes). The sinks that kept
        unused values are removed from the graph."""
        ops: list[tuple[str, TracedOp]] = []
        scopes: dict[str, None] = {}
        sinks = []
        for node in graph.nodes():
            seen = read_in_trace.get(node)
            if seen is None:
                kind: Optional[str] = node.kind()
                if kind == KEEP_ALIVE and not node.outputsSize():
                    sinks.append(node)
                    continue
                if kind.startswith("prim::"):
                    kind = prim_op_kind(node, kind)
                scope = full_scope(node.scopeName())
            else:
                kind, scope = seen
            scopes[scope] = None
            if kind is not None:
                ops.append((kind, (node, scope)))
        for node in sinks:
            node.destroy()
        return cls(graph, tuple(ops), tuple(scopes), tuple(caught))

    def operations(self) -> Iterator[tuple[str, TracedOp]]:
        return iter(self.ops)

    def module_output_shapes(self) -> dict[str, list[tuple[int, ...]]]:
        """The shapes of the tensors each module returned, read from the graph: a value an op of a
        module's call made, and that is used outside that call (or returned by the model), left
        the module. Graph bookkeeping between ops (lists, tuples) is looked through."""
        scope_of = {node: scope for _, (node, scope) in self.ops}
        shapes: dict[str, dict[str, tuple[int, ...]]] = {}
        for _, (node, scope) in self.ops:
            for output in node.outputs():
                kind = output.type()
                sizes = kind.sizes() if isinstance(kind, torch._C.TensorType) else None
                if sizes is None:
                    continue
                used_in = [user.split("/") if user is not None else None for user in _user_scopes(output, scope_of)]
                for module in scope.split("/"):
                    if any(path is None or module not in path for path in used_in):
                        shapes.setdefault(module, {})[output.debugName()] = tuple(sizes)
        return {module: list(found.values()) for module, found in shapes.items()}

    def replay_warnings(self, mode: str) -> None:
        """Show the warnings raised while tracing, filtered by the tracer-warning mode (fvcore shows
        them whenever it traces; a kept trace shows them whenever it is counted)."""
        for caught in self.caught:
            if mode == "all" or (mode == "no_tracer_warning" and not issubclass(caught.category, TracerWarning)):
                warnings.warn_explicit(caught.message, caught.category, caught.filename, caught.lineno)

    @staticmethod
    def scope_of(op: TracedOp) -> str:
        return op[1]

    @staticmethod
    def record(op: TracedOp, kind: str, module: str) -> OpRecord:
        return JitOpRecord(op[0], kind, module)

    def scopes(self) -> Iterator[str]:
        """Every distinct full scope of the graph's nodes, root first: ``"/a/a.b"``."""
        return iter(self.distinct_scopes)

    @staticmethod
    def parts(op: TracedOp) -> list[tuple[str, TracedOp]]:
        """The ops of a custom autograd Function's forward (``prim::PythonOp``), which the tracer
        keeps as the node's subgraph: what the Function runs, and what the dispatch backend sees."""
        node, scope = op
        if node.kind() != "prim::PythonOp" or "Subgraph" not in node.attributeNames():
            return []
        parts = []
        for part in node.g("Subgraph").nodes():
            kind = part.kind()
            if kind.startswith("prim::"):
                kind = prim_op_kind(part, kind)
            if kind is not None:
                parts.append((kind, (part, scope)))
        return parts


_TORCH_INTERNAL_ERRORS = ("INTERNAL ASSERT FAILED", "unordered_map::at")
"""Messages of errors raised by torch's own C++ code rather than by the model: a failed internal
assertion (the tracer's alias analysis on some ops), a C++ lookup that escaped as a RuntimeError."""


def _user_scopes(value: "torch._C.Value", scope_of: Mapping["torch._C.Node", str]) -> list[Optional[str]]:
    """The scopes of the ops (``scope_of``) that use ``value``, through graph bookkeeping (None: the model's output)."""
    found: list[Optional[str]] = []
    for use in value.uses():
        user = use.user
        if user in scope_of:
            found.append(scope_of[user])
        elif user.kind() == "prim::Return":
            found.append(None)
        else:
            found.extend(scope for output in user.outputs() for scope in _user_scopes(output, scope_of))
    return found


def _explained(failed: nn.Module, error: Exception) -> Exception:
    """What the tracer's error means where the model is not at fault: a scripted submodule, which the
    trace cannot enter, or an error inside torch's own code; both point to the dispatch backend."""
    if isinstance(failed, torch.jit.ScriptModule):
        return JitflopsError(
            f"a scripted module (torch.jit.script) cannot run inside the trace jitflops takes of the model "
            f"({str(error).splitlines()[0]}); {USE_DISPATCH}"
        )
    if isinstance(error, RuntimeError) and any(marker in str(error) for marker in _TORCH_INTERNAL_ERRORS):
        return JitflopsError(
            f"torch's JIT tracer failed inside torch itself ({type(error).__name__}: {str(error).splitlines()[0]}), "
            f"a torch bug rather than a fault of the model; {USE_DISPATCH}"
        )
    return error


def _tracer_call(runner: FlatCall) -> tuple[Any, ...]:
    """The arguments of ``torch._C._create_graph_by_tracing`` that trace ``runner`` as
    ``torch.jit._get_trace_graph(runner, runner.flat_inputs())`` does, with fewer Python frames.

    The tracer walks every frame of the Python stack for every node it records (each frame costs
    about 1% of the trace on MobileNetV2: ``tools/bench.py``). ``_get_trace_graph`` reaches the
    C++ tracer through a wrapper module (four frames), and calling ``runner`` as a module adds
    three more (``__call__``'s layers): the tracer is given ``runner.forward``, and the caller makes
    the call itself rather than through a helper. The rest is the wrapper's call: the inputs followed
    by the parameters and buffers (so weights are graph inputs, not constants), torch's value-name
    lookup, strict mode, no forced out-of-place ops.
    """
    state = list(jit_trace._unique_state_dict(runner, keep_vars=True).values())
    return runner.forward, list(runner.flat_inputs()) + state, jit_trace._create_interpreter_name_lookup_fn(), True, False


def trace_with_scopes(
    model: nn.Module,
    call: ModelCall,
    aliases: Mapping[Any, str],
    strict: bool = False,
    scope_boundaries: bool = True,
    compute: Optional[bool] = None,
) -> ScopedTrace:
    """Trace ``model`` called with ``call``; ``aliases`` gives each module's canonical scope name.

    ``compute``: ``False`` traces on values without data (``meta``, see :mod:`jitflops.frontends.meta_values`)
    and raises where the model needs real values; ``True`` traces on the real values; ``None``
    (default) traces on meta values where that costs less (all but small calls), falling back to
    real values where the model needs them. The counts are the same either way.
    """
    tracer, arguments = tracing_plan(model, call, aliases, strict, scope_boundaries, compute)
    return tracer(*arguments)


def tracing_plan(
    model: nn.Module, call: ModelCall, aliases: Mapping[Any, str], strict: bool, scope_boundaries: bool, compute: Optional[bool]
) -> tuple[Callable[..., ScopedTrace], tuple[Any, ...]]:
    """The function that traces as :func:`trace_with_scopes` does, and its arguments, for the caller
    to call from its own frame: the tracer walks every Python frame above it for each node it
    records (about 1% of a MobileNetV2 trace per frame). On real values, that is the function that
    calls the tracer."""
    parameters = list(model.parameters())
    on_values = computes_by_default(model, parameters, call) if compute is None else compute
    on_meta_device = holds_meta(parameters, call)
    if on_values and not on_meta_device:
        return _trace_with_scopes, (model, call, aliases, strict, scope_boundaries)
    return _trace_without_computing, (model, call, aliases, strict, scope_boundaries, on_values, on_meta_device, compute is False)


def _trace_without_computing(
    model: nn.Module,
    call: ModelCall,
    aliases: Mapping[Any, str],
    strict: bool,
    scope_boundaries: bool,
    on_values: bool,
    on_meta_device: bool,
    forced: bool,
) -> ScopedTrace:
    """The trace on values without data: a meta copy of the model unless ``on_values``, or the model
    itself where it is built on the meta device (``on_meta_device``); real values where the model
    needs them (unless ``forced``). A model on the meta device has no values: it is traced there or
    not at all (a copy on the CPU would allocate its whole size, and feed uninitialised integers to
    its embeddings)."""
    if not on_values:
        blocker = meta_blocker(model, call)
        if blocker is None:
            try:
                return _trace_copy(model, call, aliases, strict, scope_boundaries)
            except Exception as error:  # the model needs real values: trace those (an interrupt is not caught)
                if forced:
                    raise JitflopsError(f"the model cannot be traced without real values (compute=False): {error}") from error
                logger.debug("traced on real values: the trace on meta values failed: %s", error)
        elif forced:
            raise JitflopsError(f"the model cannot be traced without real values (compute=False): {blocker}")
        else:
            logger.debug("traced on real values: %s", blocker)
    if on_meta_device:  # no values to compute with
        try:
            return _checked_meta_trace(model, call, aliases, strict, scope_boundaries)
        except Exception as error:
            if reads_a_meta_value(error.__cause__ or error):  # the dispatch backend runs the same forward: it would read it too
                raise JitflopsError(
                    f"the model on the meta device could not be traced there: {error}; {READS_A_VALUE}"
                ) from error
            raise JitflopsError(
                f"the model on the meta device could not be traced there: {error}; where it needs values it does not have "
                f"(jitflops never allocates them), {USE_DISPATCH} (on meta)"
            ) from error
    return _trace_with_scopes(model, call, aliases, strict, scope_boundaries)


def _trace_copy(model: nn.Module, call: ModelCall, aliases: Mapping[Any, str], strict: bool, scope_boundaries: bool) -> ScopedTrace:
    """The trace of a copy of the model whose tensors are meta tensors."""
    twin, twin_call, copies = empty_copy(model, call)
    twin_aliases = {copies.get(module, module): name for module, name in aliases.items()}
    return _checked_meta_trace(twin, twin_call, twin_aliases, strict, scope_boundaries)


def _checked_meta_trace(model: nn.Module, call: ModelCall, aliases: Mapping[Any, str], strict: bool, scope_boundaries: bool) -> ScopedTrace:
    """The trace of a model on meta values, with jitflops' meta kernels, refused if it lost an op.

    The forward runs once on the meta values untraced first, on the path the trace takes
    (:func:`~jitflops.frontends.traced_path.on_the_traced_path`: transformers reads a padding
    mask's values only when not traced): where it needs a value (a tensor inside a list of sizes,
    Mimi's and EnCodec's padding), an untraced run fails cleanly, while the tracer would fail after
    stashing the list's traced elements in its thread-local argument stash, which nothing clears,
    so that every later trace in the thread passing a list of that name fails inside torch
    (``list_trace[idx] == nullptr``), the trace on real values included."""
    with meta_kernels_for_tracing():
        with preserved(model), torch.no_grad(), on_the_traced_path(), failures_named(model, module_names(aliases), "running on meta values"):
            call.run(model)  # on a copy of a generation cache given: it grows as the forward runs
        trace = _trace_with_scopes(model, call, aliases, strict, scope_boundaries)
    lost = lost_values(trace.graph, model)
    if lost:
        raise JitflopsError(f"the tracer did not record the ops that made {', '.join(lost[:3])}: they became constants")
    return trace


def _trace_with_scopes(model: nn.Module, call: ModelCall, aliases: Mapping[Any, str], strict: bool, scope_boundaries: bool) -> ScopedTrace:
    """The trace of :func:`trace_with_scopes`, on the values ``call`` has.

    ``DataParallel`` and ``DistributedDataParallel`` wrappers are traced through their inner
    module. The model comes back unchanged, whether the trace succeeds or not.

    Where Python control flow depends on the values of the model's inputs, the trace follows the
    path those inputs took: as fvcore does, that path is counted and a
    :class:`~jitflops.core.errors.DataDependentTraceWarning` names the module and source line;
    ``strict=True`` raises a :class:`~jitflops.core.errors.TraceError` instead.

    ``scope_boundaries=False`` leaves the tracer's own scopes on the graph's nodes (``scopeName()``),
    at their cost, for code that reads them.
    """
    if is_compiled(model):
        raise JitflopsError(f"the model is compiled with torch.compile, which the JIT tracer cannot follow: {USE_DISPATCH}")
    traced = model.module if isinstance(model, _WRAPPERS) else model
    scope_names = module_names(aliases)
    boundaries, read_in_trace = ScopeBoundaries(enabled=scope_boundaries, names=scope_names), {}
    runner = FlatCall(traced, call, around_model=recording(boundaries, read_in_trace))
    with preserved(model), warnings.catch_warnings(), torch.no_grad():  # process-wide state is read and set under the lock
        collected = TraceWarnings(scope_names, len(runner.flat_inputs()))
        warnings.simplefilter("default", TracerWarning)
        warnings.showwarning = collected
        previous_map = jit_trace._trace_module_map
        jit_trace._trace_module_map = scope_names
        try:
            with failures_named(model, scope_names, "tracing", _explained):
                graph, _ = torch._C._create_graph_by_tracing(*_tracer_call(runner))
        finally:
            jit_trace._trace_module_map = previous_map
    if collected.data_dependent:
        filename, lineno, module = collected.data_dependent[0]
        module_type = type(model.get_submodule(module)).__name__ if module else type(model).__name__
        problem = (
            f"its Python control flow depends on tensor values ({filename}:{lineno}, {len(collected.data_dependent)} "
            f"place(s)): a JIT trace follows the path these inputs took and bakes the values in"
        )
        if strict:
            raise TraceError(module, module_type, JitflopsError(f"{problem}; {USE_DISPATCH}"))
        warnings.warn(
            f"{describe_scope(module)} ({module_type}): {problem}; that path is counted. For the path any input takes, "
            f"{USE_DISPATCH}; strict=True raises instead",
            DataDependentTraceWarning,
            stacklevel=2,
        )
    return ScopedTrace.read(graph, read_in_trace, collected.caught)

