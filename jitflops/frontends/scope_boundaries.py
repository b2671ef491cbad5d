"""What runs inside the JIT trace: scope boundaries, and one pass over the graph before the
tracer's clean-up.

``push_scope``/``pop_scope`` note where each module's scope opens and closes (:class:`ScopeBoundaries`);
at the end of the model's call, still inside the trace, :func:`read_in_trace` gives every node its
kind and scope from those boundaries, keeps alive what the model computed and dropped, and gives
the ops that took a Python bool as a Scalar an int (:func:`_bools_as_scalars`).
:class:`~jitflops.frontends.scoped_trace.ScopedTrace` reads the result.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator, Mapping, Optional, Sequence

import torch
import torch.nn.modules.module as module_machinery
from torch import nn

from ..core.errors import JitflopsError
from .jit_fallback import USE_DISPATCH
from ..core.records import node_outputs

KEEP_ALIVE = "prim::Print"
"""The sink that keeps computations with unused results in the graph: a node kind with side effects,
which the tracer's dead-code elimination never removes, taking every otherwise unused value."""

NodeScopes = dict["torch._C.Node", tuple[Optional[str], str]]
"""What the pass inside the trace read of each node: the kind it is counted under (None for graph
bookkeeping) and its full scope."""


def prim_op_kind(node: "torch._C.Node", kind: str) -> Optional[str]:
    """The kind a ``prim::`` node is counted under, or None for graph bookkeeping: a custom autograd
    Function is named after its class, as in fvcore."""
    return f"prim::PythonOp.{node.pyname()}" if kind == "prim::PythonOp" else None


def _scripted_call(node: "torch._C.Node", scope: str) -> JitflopsError:
    """A scripted function (``torch.jit.script``) called inside the trace: the tracer keeps it as one
    ``prim::CallFunction`` whose graph holds no shapes, so its ops cannot be counted from the trace
    (fvcore counts it 0): the dispatch backend counts the model, as it does a scripted module."""
    name = node.inputsAt(0).node().s("name") if node.inputsSize() else "?"
    module = scope.rpartition("/")[2]
    return JitflopsError(
        f"the forward calls a scripted function, {name} (torch.jit.script), in {f'module {module!r}' if module else 'the model'}, "
        f"whose graph the trace keeps without shapes; {USE_DISPATCH}"
    )


def full_scope(scope_name: str) -> str:
    """The node's scope with the root module (``""``) in front, as fvcore's scopes read: ``"/a/a.b"``."""
    return "/" + scope_name if scope_name else ""


class ScopeBoundaries:
    """Inside a trace: note where each module's scope opens and closes, as the graph's last node at
    that moment (``events``: ``(node, name)`` for a push, ``(node, None)`` for a pop, in order).

    ``push_scope``/``pop_scope`` attributes shadow the methods on this trace's ``TracingState``
    object only; pybind11 hands out that same object for as long as it is alive. Should it not, the
    tracer's own scopes are left to work (at their cost), and :meth:`ScopedTrace.read` reads those.
    pybind11 also hands out one wrapper per live node, so the nodes noted here are the objects a
    later walk over the graph meets. ``names`` (each module's scope name) lets the module calls of
    the trace note their boundaries directly (:func:`_direct_module_calls`).
    """

    def __init__(self, enabled: bool = True, names: Optional[Mapping[nn.Module, str]] = None) -> None:
        self.enabled = enabled
        self.names = names
        self.installed = False
        """Whether this trace got the boundaries (else the tracer's own scope blocks are in the graph)."""
        self.events: list[tuple["torch._C.Node", Optional[str]]] = []

    @contextmanager
    def __call__(self) -> Iterator[None]:
        state = torch._C._get_tracing_state()
        if not self.enabled or state is None or torch._C._get_tracing_state() is not state:
            yield
            return
        last_node, events = state.graph().return_node().prev, self.events

        def push_scope(name: str) -> None:
            events.append((last_node(), name))

        def pop_scope() -> None:
            events.append((last_node(), None))

        state.push_scope, state.pop_scope = push_scope, pop_scope
        self.installed = True
        try:
            with nullcontext() if self.names is None else _direct_module_calls(_TracedCalls(state, self.names)):
                yield
        finally:
            del state.push_scope, state.pop_scope


_CALL_MACHINERY = ("_wrapped_call_impl", "_call_impl", "_slow_forward")
"""``nn.Module``'s methods between a module's call and its ``forward``."""


@dataclass(frozen=True)
class _TracedCalls:
    """What a module call inside one trace needs: the trace's state (whose ``push_scope``/``pop_scope``
    note the boundaries while the module calls are direct) and the scope names."""

    state: "torch._C.TracingState"
    names: Mapping[nn.Module, str]


_this_thread = threading.local()
"""``traced_calls``: the :class:`_TracedCalls` of the trace running in this thread, if any."""
_install_lock = threading.Lock()
_installed_by = 0
"""How many traces, in all threads, have :func:`_direct_call` installed now."""


def _runs_module_machinery(cls: type) -> bool:
    """Whether calling an instance of ``cls`` runs ``nn.Module``'s own call machinery (no override)."""
    return all(getattr(cls, name) is getattr(nn.Module, name) for name in _CALL_MACHINERY)


def _has_hooks(module: nn.Module) -> bool:
    """Whether a call of ``module`` would run hooks: its own, or global module hooks."""
    return bool(
        module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks
        or module_machinery._global_forward_hooks or module_machinery._global_forward_pre_hooks
        or module_machinery._global_backward_hooks or module_machinery._global_backward_pre_hooks
    )


def _direct_call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``nn.Module.__call__`` while jitflops traces (:func:`_direct_module_calls`)."""
    traced = getattr(_this_thread, "traced_calls", None)
    if (
        traced is None
        or torch._C._get_tracing_state() is not traced.state
        or self._compiled_call_impl is not None
        or _has_hooks(self)
        or not _runs_module_machinery(type(self))
    ):
        return nn.Module._wrapped_call_impl(self, *args, **kwargs)
    forward = self.forward
    name = traced.names.get(self)
    if not name or isinstance(forward, torch._C.ScriptMethod):
        return forward(*args, **kwargs)
    traced.state.push_scope(name)
    try:
        return forward(*args, **kwargs)
    finally:
        traced.state.pop_scope()


@contextmanager
def _direct_module_calls(traced: _TracedCalls) -> Iterator[None]:
    """For the duration of the model's call inside the trace, ``nn.Module.__call__`` goes straight
    to ``forward`` between this trace's scope boundaries, as ``torch.fx``'s tracer patches it.

    The tracer walks the whole Python stack for every node it records (the node's source range, and
    one walk per constant argument: a convolution records 14), and ``nn.Module``'s call adds three
    frames per module level on the way to ``forward`` while tracing (``_wrapped_call_impl``,
    ``_call_impl``, ``_slow_forward``); this call adds one: 8-16% off a default count on
    MobileNetV2, ResNet-50, Swin-T, T5, Llama and BERT (``docs/benchmarks.md``). It does what those
    three do for a module without hooks, not compiled, whose class keeps ``nn.Module``'s machinery;
    any other call (hooks, a compiled module, another thread, another trace) goes through
    ``nn.Module``'s own call, and the tracer's scope methods, which the trace's boundaries shadow.
    Traces in several threads at once share one installation, removed when the last ends; a
    ``nn.Module.__call__`` replaced by someone else is left alone, also when it replaces this one.
    """
    global _installed_by
    with _install_lock:
        installs = nn.Module.__call__ in (_direct_call, nn.Module._wrapped_call_impl)
        if installs:
            nn.Module.__call__ = _direct_call  # type: ignore[method-assign]
            _installed_by += 1
    outer, _this_thread.traced_calls = getattr(_this_thread, "traced_calls", None), traced
    try:
        yield
    finally:
        _this_thread.traced_calls = outer
        if installs:
            with _install_lock:
                _installed_by -= 1
                if not _installed_by and nn.Module.__call__ is _direct_call:
                    nn.Module.__call__ = nn.Module._wrapped_call_impl  # type: ignore[method-assign]


SHAPE_QUERIES = frozenset({"aten::size", "aten::sizes", "aten::numel", "aten::dim", "aten::sym_size"})

_NOT_WORK = SHAPE_QUERIES | {"aten::Int", "aten::Float", "aten::Bool", "aten::ScalarImplicit"}
"""Ops whose unused results are left to the dead-code elimination: shape queries and conversions
(Python code asks for sizes it then does not use), and graph bookkeeping (``prim::`` other than
Python ops): none of it is work a model runs."""


def read_in_trace(
    graph: "torch._C.Graph", block: "torch._C.Block", boundaries: Optional[Sequence[tuple["torch._C.Node", Optional[str]]]]
) -> NodeScopes:
    """One pass over a trace's ``block`` before the tracer's clean-up: each node's kind and scope,
    from the scope ``boundaries`` (None: the tracer kept its own scopes, read later), and a sink.

    The sink: every value nothing uses becomes an input of a sink node placed at the block's end,
    so that the tracer's dead-code elimination keeps what the model computed and dropped (an unused
    branch, a discarded layer): a profiler counts what runs. Scope blocks (the tracer's own scopes)
    get a sink of their own. :meth:`ScopedTrace.read` removes the sinks.

    The ops a custom autograd Function's forward ran are traced twice: into the graph, right after
    the Function's own node (which replaces their result), and into that node's subgraph. Those in
    the graph (told by the subgraph's sequence of kinds) are left to the dead-code elimination;
    :meth:`ScopedTrace.parts` counts the subgraph's.
    """
    read: NodeScopes = {}
    unused = []
    bools = []
    twins: list[str] = []  # kinds of the graph's copies still expected after a Function's node, in order
    events = iter(boundaries or ())
    event_node, event_name = next(events, (None, None))  # the next scope event happens right after event_node
    open_scopes = [""]
    scope = ""
    previous = graph.param_node()
    for node in block.nodes():
        while event_node is previous:
            if event_name is None:
                open_scopes.pop()
            else:
                open_scopes.append(f"{open_scopes[-1]}/{event_name}")
            scope = open_scopes[-1]
            event_node, event_name = next(events, (None, None))
        previous = node
        kind = node.kind()
        is_prim = kind.startswith("prim::")
        if kind == "prim::Constant" and isinstance(node.output().type(), torch._C.BoolType):
            bools.append(node)
        if kind == "prim::CallFunction":
            raise _scripted_call(node, scope)
        if boundaries is not None:
            read[node] = (prim_op_kind(node, kind) if is_prim else kind, scope)
        if twins:
            if kind == twins[0]:
                twins.pop(0)
                continue
            twins = []
        if kind == "prim::TracedModuleForward":
            for inner in node.blocks():
                read_in_trace(graph, inner, None)
        elif kind == "prim::PythonOp" and "Subgraph" in node.attributeNames():
            twins = [part.kind() for part in node.g("Subgraph").nodes()]
        if (kind == "prim::PythonOp" or not (is_prim or kind in _NOT_WORK)) and not node.hasUses():
            unused.extend(node_outputs(node))
    while event_node is not None:  # the scopes closed after the last node; any other event was not met
        if event_node is not previous:
            raise JitflopsError("the trace lost a node that marked where a module's scope opens or closes: module scopes cannot be read")
        event_node, event_name = next(events, (None, None))
    if unused:
        graph.create(KEEP_ALIVE, unused, 0).insertBefore(block.returnNode())
    _bools_as_scalars(graph, bools)
    return read


def _bools_as_scalars(graph: "torch._C.Graph", constants: Sequence["torch._C.Node"]) -> None:
    """Give the ops that took a Python bool as a ``Scalar`` (``mask.scatter(-1, index, False)``,
    ``x.masked_fill(m, True)``, ``torch.full_like(x, True)``) the same value as an int.

    The tracer records such an argument as a bool constant, which no overload's ``Scalar`` matches;
    the tracer's clean-up then fails inside torch ("INTERNAL ASSERT FAILED ... We don't have an op for
    aten::scatter but it isn't a special case"), as on the sparse-attention models of transformers
    (DeepSeek-V3.2's indexer). A Scalar is cast to the op's dtype, so ``True`` and ``1`` give the same
    result. Only the uses that match no schema are rewritten: a bool argument stays a bool.
    """
    for constant in constants:
        value = constant.output()
        for use in value.uses():
            user = use.user
            if user.kind().startswith("aten::") and user.schema() == "(no schema)":
                with graph.insert_point_guard(user):
                    user.replaceInput(use.offset, graph.insertConstant(int(value.toIValue())))


def recording(boundaries: ScopeBoundaries, read: NodeScopes) -> Callable[[], ContextManager[None]]:
    """What runs around the model's call inside the trace: scope boundaries, then the pass that
    reads each node's scope (into ``read``) and sinks unused values."""

    @contextmanager
    def around_model() -> Iterator[None]:
        with boundaries():
            yield
        graph = torch._C._get_tracing_state().graph()
        read.update(read_in_trace(graph, graph.block(), boundaries.events if boundaries.installed else None))

    return around_model
