"""Trace a model's aten graph with the module scope of every node.

Forward pre-hooks push a scope named after each module, forward hooks pop it, so each node of
the traced graph carries the chain of module names that were running (``node.scopeName()``, names
joined by ``/``, the root being ``""``). The hooks also note which modules were called and which
module was innermost when something failed, so errors can name it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn
from torch.jit import TracerWarning

from .errors import TraceError
from .model_guard import preserved
from .model_io import FlatCall, ModelCall

TRACER_WARNING_MODES = ("all", "no_tracer_warning", "none")

_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel)


@dataclass(frozen=True)
class ScopedTrace:
    """A traced graph whose nodes know their module scope, and the modules whose ``__call__`` ran."""

    graph: "torch._C.Graph"
    called_modules: frozenset[str]


class _ScopeRecorder:
    """Pushes and pops tracer scopes and remembers the stack of running modules."""

    def __init__(self) -> None:
        self.stack: list[tuple[str, nn.Module]] = []
        self.called: set[str] = set()

    def pre_hook(self, name: str):
        def push(module: nn.Module, args: Any) -> None:
            self.called.add(name)
            self.stack.append((name, module))
            state = torch._C._get_tracing_state()
            if state:
                state.push_scope(name)

        return push

    def post_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        self.stack.pop()
        state = torch._C._get_tracing_state()
        if state:
            state.pop_scope()

    def failure(self, model: nn.Module, cause: BaseException) -> TraceError:
        name, module = self.stack[-1] if self.stack else ("", model)
        return TraceError(name, type(module).__name__, cause)


def _warning_filter(mode: str) -> None:
    if mode == "none":
        warnings.simplefilter("ignore")
    elif mode == "no_tracer_warning":
        warnings.filterwarnings("ignore", category=TracerWarning)


def trace_with_scopes(
    model: nn.Module,
    call: ModelCall,
    aliases: Mapping[nn.Module, str],
    tracer_warnings: str = "no_tracer_warning",
) -> ScopedTrace:
    """Trace ``model`` called with ``call``; ``aliases`` gives each module's canonical scope name.

    ``DataParallel`` and ``DistributedDataParallel`` wrappers are traced through their inner
    module, which also carries the wrapper's (root) scope, as fvcore does. The model comes back
    unchanged, whether the trace succeeds or not.
    """
    recorder = _ScopeRecorder()
    traced = model.module if isinstance(model, _WRAPPERS) else model
    with preserved(model), warnings.catch_warnings(), torch.no_grad():
        _warning_filter(tracer_warnings)
        if traced is not model:
            traced.register_forward_pre_hook(recorder.pre_hook(aliases[model]))
            traced.register_forward_hook(recorder.post_hook)
        for module in traced.modules():
            module.register_forward_pre_hook(recorder.pre_hook(aliases[module]))
            module.register_forward_hook(recorder.post_hook)
        runner = FlatCall(traced, call)
        try:
            graph, _ = torch.jit._get_trace_graph(runner, runner.flat_inputs())
        except Exception as error:
            raise recorder.failure(model, error) from error
    return ScopedTrace(graph, frozenset(recorder.called))
