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
import logging
import warnings
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Iterator, Mapping, Optional

import torch
import torch.jit._trace as jit_trace
from torch import nn
from torch.jit import TracerWarning

from .errors import JitflopsError, TraceError
from .model_guard import preserved
from .model_io import FlatCall, ModelCall
from .records import JitOpRecord, OpRecord

logger = logging.getLogger(__name__)

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


def _innermost_module(traceback: Optional[TracebackType], names: Mapping[nn.Module, str]) -> Optional[nn.Module]:
    """The deepest frame of the traceback that runs a method of one of the model's modules."""
    found = None
    while traceback is not None:
        owner = traceback.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and owner in names:
            found = owner
        traceback = traceback.tb_next
    return found


USE_DISPATCH = "use FlopCountAnalysis(..., backend='dispatch'), which records the ops as they run"


def _is_compiled(model: nn.Module) -> bool:
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:  # a torch without dynamo
        return False
    return isinstance(model, OptimizedModule)


def _python_value_warnings(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    """Tracer warnings that a tensor became a Python value in the user's own code (not in a library)."""
    return [
        w for w in caught
        if issubclass(w.category, TracerWarning) and "Converting a tensor to a Python" in str(w.message)
        and "site-packages" not in w.filename and "dist-packages" not in w.filename
    ]


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
    with preserved(model), warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always", TracerWarning)
        runner = FlatCall(traced, call)
        jit_trace._trace_module_map = scope_names
        try:
            graph, _ = torch.jit._get_trace_graph(runner, runner.flat_inputs())
        except Exception as error:
            failed = _innermost_module(error.__traceback__, scope_names) or model
            raise TraceError(aliases[failed], type(failed).__name__, error) from error
        finally:
            jit_trace._trace_module_map = previous_map
    _replay_warnings(caught, tracer_warnings)
    if not runner.returned_tensors:
        raise JitflopsError(
            "the model returned no tensor, and a JIT trace keeps only the ops that produce its tensor outputs, "
            f"so nothing would be counted: {USE_DISPATCH}"
        )
    data_dependent = _python_value_warnings(caught)
    if data_dependent:
        first = data_dependent[0]
        logger.warning(
            "the model turned tensors into Python values during the trace (%d time(s), first at %s:%d): where that "
            "decided control flow, the count is for this input's path only; to count what runs for each input, %s",
            len(data_dependent), first.filename, first.lineno, USE_DISPATCH,
        )
    return ScopedTrace(graph)


def _replay_warnings(caught: list[warnings.WarningMessage], mode: str) -> None:
    """Show the warnings raised while tracing, filtered by the tracer-warning mode."""
    for message in caught:
        if mode == "all" or (mode == "no_tracer_warning" and not issubclass(message.category, TracerWarning)):
            warnings.warn_explicit(message.message, message.category, message.filename, message.lineno)
