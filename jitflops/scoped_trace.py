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

import warnings
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Iterator, Mapping, Optional

import torch
import torch.jit._trace as jit_trace
from torch import nn
from torch.jit import TracerWarning

from .errors import TraceError
from .model_guard import preserved
from .model_io import FlatCall, ModelCall

TRACER_WARNING_MODES = ("all", "no_tracer_warning", "none")

_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel)


@dataclass(frozen=True)
class ScopedTrace:
    """A traced graph whose nodes know their module scope."""

    graph: "torch._C.Graph"

    def scopes(self) -> Iterator[str]:
        """Every distinct full scope of the graph's nodes, root first: ``"/a/a.b"``."""
        return iter(dict.fromkeys(full_scope(node.scopeName()) for node in self.graph.nodes()))


def full_scope(scope_name: str) -> str:
    """The node's scope with the root module (``""``) in front, as fvcore's scopes read: ``"/a/a.b"``."""
    return "/" + scope_name if scope_name else ""


def _warning_filter(mode: str) -> None:
    if mode == "none":
        warnings.simplefilter("ignore")
    elif mode == "no_tracer_warning":
        warnings.filterwarnings("ignore", category=TracerWarning)


def _innermost_module(traceback: Optional[TracebackType], names: Mapping[nn.Module, str]) -> Optional[nn.Module]:
    """The deepest frame of the traceback that runs a method of one of the model's modules."""
    found = None
    while traceback is not None:
        owner = traceback.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and owner in names:
            found = owner
        traceback = traceback.tb_next
    return found


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
    traced = model.module if isinstance(model, _WRAPPERS) else model
    scope_names = {module: aliases[module] for module in traced.modules()}
    previous_map = jit_trace._trace_module_map
    with preserved(model), warnings.catch_warnings(), torch.no_grad():
        _warning_filter(tracer_warnings)
        runner = FlatCall(traced, call)
        jit_trace._trace_module_map = scope_names
        try:
            graph, _ = torch.jit._get_trace_graph(runner, runner.flat_inputs())
        except Exception as error:
            failed = _innermost_module(error.__traceback__, scope_names) or model
            raise TraceError(aliases[failed], type(failed).__name__, error) from error
        finally:
            jit_trace._trace_module_map = previous_map
    return ScopedTrace(graph)
