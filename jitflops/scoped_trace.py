"""Trace a model's aten graph with the module scope of every node.

While tracing, ``nn.Module.__call__`` pushes a tracer scope named after each module listed in
torch's ``torch.jit._trace._trace_module_map`` (the mechanism ``torch.jit.trace_module`` and the
ONNX exporter use), so each node of the graph carries the chain of module names that were running
(``node.scopeName()``, names joined by ``/``). jitflops fills that map with the canonical module
names for the duration of the trace, and puts back what was there before.

Why not forward pre/post hooks that push and pop the scopes (as fvcore does)? For every node it
records, the tracer walks the whole Python stack to note the source location; a hook adds a frame at
every module level, so hooks cost up to 20% of the trace on deep models (measured with
``tools/bench.py``). Without hooks, the module that was running when something failed is found
from the exception's traceback instead.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any, Iterable, Iterator, Mapping, Optional

import torch
import torch.jit._trace as jit_trace
from torch import nn
from torch.jit import TracerWarning

from .errors import JitflopsError, TraceError
from .model_guard import preserved
from .model_io import FlatCall, ModelCall
from .records import JitOpRecord, OpRecord

TRACER_WARNING_MODES = ("all", "no_tracer_warning", "none")

_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel)


@dataclass(frozen=True)
class ScopedTrace:
    """A traced graph whose nodes know their module scope: an op source for the engine.

    ``operations()`` yields ``(kind, node)`` for every op node (graph bookkeeping, the ``prim::``
    nodes other than Python ops and calls, is skipped); ``scope_of`` and ``record`` are only asked
    for the nodes the engine counts, so the rest cost next to nothing.
    """

    graph: "torch._C.Graph"

    def operations(self) -> Iterator[tuple[str, "torch._C.Node"]]:
        for node in self.graph.nodes():
            kind = node.kind()
            if kind.startswith("prim::"):
                if kind == "prim::PythonOp":  # a custom autograd.Function: named after its class, as in fvcore
                    kind = f"prim::PythonOp.{node.pyname()}"
                elif kind != "prim::CallFunction":
                    continue
            yield kind, node

    @staticmethod
    def scope_of(node: "torch._C.Node") -> str:
        return full_scope(node.scopeName())

    @staticmethod
    def record(node: "torch._C.Node", kind: str, module: str) -> OpRecord:
        return JitOpRecord(node, kind, module)

    def scopes(self) -> Iterator[str]:
        """Every distinct full scope of the graph's nodes, root first: ``"/a/a.b"``."""
        return iter(self._distinct_scopes)

    @functools.cached_property
    def _distinct_scopes(self) -> tuple[str, ...]:
        return tuple(full_scope(name) for name in dict.fromkeys(node.scopeName() for node in self.graph.nodes()))


def full_scope(scope_name: str) -> str:
    """The node's scope with the root module (``""``) in front, as fvcore's scopes read: ``"/a/a.b"``."""
    return "/" + scope_name if scope_name else ""


def _innermost_module(frames: Iterable[FrameType], names: Mapping[nn.Module, str]) -> Optional[nn.Module]:
    """The first of ``frames`` (innermost first) that runs a method of one of the model's modules."""
    for frame in frames:
        owner = frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and owner in names:
            return owner
    return None


def _traceback_frames(traceback: Optional[TracebackType]) -> list[FrameType]:
    """The frames of a traceback, innermost first."""
    frames = []
    while traceback is not None:
        frames.append(traceback.tb_frame)
        traceback = traceback.tb_next
    return frames[::-1]


def _stack_frames(frame: Optional[FrameType]) -> Iterator[FrameType]:
    """The running frames from ``frame`` outwards."""
    while frame is not None:
        yield frame
        frame = frame.f_back


USE_DISPATCH = "use FlopCountAnalysis(..., backend='dispatch'), which records the ops as they run"


def _is_compiled(model: nn.Module) -> bool:
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:  # a torch without dynamo
        return False
    return isinstance(model, OptimizedModule)


_SHAPE_SOURCES = frozenset({"aten::size", "aten::sizes", "aten::numel", "aten::dim", "prim::Constant"})


def _depends_on_data(value_producer: "torch._C.Node") -> bool:
    """Whether a node's result is computed from tensor data (a graph input reached without passing
    through a shape query), rather than from shapes and constants alone."""
    pending, seen = [value_producer], set()
    while pending:
        node = pending.pop()
        if node.kind() == "prim::Param":
            return True
        if node.kind() in _SHAPE_SOURCES or id(node) in seen:
            continue
        seen.add(id(node))
        pending.extend(value.node() for value in node.inputs())
    return False


class _TraceWarnings:
    """Collects what the trace warns about, and notes where Python code turned a tensor's *data*
    into a Python value (a branch, a loop bound, an index), which a trace cannot follow.

    The tracer warns when a tensor becomes a Python value, for shape arithmetic
    (``if x.shape[1] > 3``) and data (``if x.sum() > 0``) alike. At that moment the tensor being
    converted was the last one traced, so walking back from the graph's last node tells the two apart.
    """

    def __init__(self, names: Mapping[nn.Module, str]) -> None:
        self.names = names
        self.caught: list[warnings.WarningMessage] = []
        self.data_dependent: list[tuple[str, int, str]] = []

    def __call__(self, message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        self.caught.append(warnings.WarningMessage(message, category, filename, lineno, file, line))
        state = torch._C._get_tracing_state()
        if state is None or not issubclass(category, TracerWarning) or "Converting a tensor to a Python" not in str(message):
            return
        if _depends_on_data(state.graph().return_node().prev()):
            module = _innermost_module(_stack_frames(inspect.currentframe()), self.names)
            self.data_dependent.append((filename, lineno, self.names[module] if module is not None else ""))

    def replay(self, mode: str) -> None:
        """Show the warnings raised while tracing, filtered by the tracer-warning mode."""
        for caught in self.caught:
            if mode == "all" or (mode == "no_tracer_warning" and not issubclass(caught.category, TracerWarning)):
                warnings.warn_explicit(caught.message, caught.category, caught.filename, caught.lineno)


def trace_with_scopes(
    model: nn.Module,
    call: ModelCall,
    aliases: Mapping[Any, str],
    tracer_warnings: str = "no_tracer_warning",
) -> ScopedTrace:
    """Trace ``model`` called with ``call``; ``aliases`` gives each module's canonical scope name.

    ``DataParallel`` and ``DistributedDataParallel`` wrappers are traced through their inner
    module. The model comes back unchanged, whether the trace succeeds or not.
    """
    if _is_compiled(model):
        raise JitflopsError(f"the model is compiled with torch.compile, which the JIT tracer cannot follow: {USE_DISPATCH}")
    traced = model.module if isinstance(model, _WRAPPERS) else model
    scope_names = {module: aliases[module] for module in traced.modules()}
    previous_map = jit_trace._trace_module_map
    collected = _TraceWarnings(scope_names)
    with preserved(model), warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("always", TracerWarning)
        warnings.showwarning = collected
        runner = FlatCall(traced, call)
        jit_trace._trace_module_map = scope_names
        try:
            graph, _ = torch.jit._get_trace_graph(runner, runner.flat_inputs())
        except Exception as error:
            failed = _innermost_module(_traceback_frames(error.__traceback__), scope_names) or model
            raise TraceError(aliases[failed], type(failed).__name__, error) from error
        finally:
            jit_trace._trace_module_map = previous_map
    collected.replay(tracer_warnings)
    if collected.data_dependent:
        filename, lineno, module = collected.data_dependent[0]
        raise TraceError(
            module,
            type(model.get_submodule(module)).__name__ if module else type(model).__name__,
            JitflopsError(
                f"its Python control flow depends on tensor values ({filename}:{lineno}, {len(collected.data_dependent)} "
                f"place(s)): a JIT trace follows one path and bakes the values in; {USE_DISPATCH}"
            ),
        )
    if not runner.returned_tensors:
        raise JitflopsError(
            "the model returned no tensor, and a JIT trace keeps only the ops that produce its tensor outputs, "
            f"so nothing would be counted: {USE_DISPATCH}"
        )
    return ScopedTrace(graph)

