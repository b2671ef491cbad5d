"""Where the model's Python control flow depends on the values of its inputs, which a JIT trace
cannot follow: told apart from shape arithmetic by walking the trace back from the converted value."""

from __future__ import annotations

import inspect
import threading
import warnings
from typing import Any, Mapping, Optional

import torch
from torch import nn
from torch.jit import TracerWarning

from ..core.records import node_inputs
from ..core.running_module import innermost_module, stack_frames
from .scope_boundaries import SHAPE_QUERIES

_SHAPE_SOURCES = SHAPE_QUERIES | {
    "prim::Constant",
    # read only their operand's shape, dtype or device
    "aten::zeros_like", "aten::ones_like", "aten::empty_like", "aten::full_like", "aten::new_zeros", "aten::new_ones",
    "aten::new_empty", "aten::new_full", "aten::new_tensor",
}


def _depends_on_data(value_producer: "torch._C.Node", user_inputs: int) -> bool:
    """Whether a node's result is computed from the data of the model's inputs (one of the graph's
    first ``user_inputs`` inputs, reached without passing through a shape query), rather than from
    shapes, constants, parameters and buffers (the graph's later inputs).

    Visited nodes are kept alive while walking: pybind11 hands out one wrapper per live node, so
    their ids are stable (ids of short-lived wrappers are reused, which made the verdict random).
    """
    pending, seen = [value_producer], {}
    while pending:
        node = pending.pop()
        if id(node) in seen or node.kind() in _SHAPE_SOURCES:
            continue
        seen[id(node)] = node
        for value in node_inputs(node):
            producer = value.node()
            if producer.kind() == "prim::Param":
                if value.offset() < user_inputs:
                    return True
            else:
                pending.append(producer)
    return False


class TraceWarnings:
    """Collects what the trace warns about, and notes where Python code turned a tensor's *data*
    into a Python value (a branch, a loop bound, an index), which a trace cannot follow.

    The tracer warns when a tensor becomes a Python value, for shape arithmetic
    (``if x.shape[1] > 3``) and data (``if x.sum() > 0``) alike. At that moment the tensor being
    converted was the last one traced, so walking back from the graph's last node tells the two apart.
    Warnings are taken once per source line (Python's ``"default"`` action: ``"always"`` costs
    about 25 µs a warning on models that convert sizes in every layer), so each line is judged by
    the first tensor it converts.

    Python's warning machinery is process-wide: warnings other threads raise meanwhile go on to the
    handler that was in place before.
    """

    def __init__(self, names: Mapping[nn.Module, str], user_inputs: int) -> None:
        self.names = names
        self.user_inputs = user_inputs
        self.caught: list[warnings.WarningMessage] = []
        self.data_dependent: list[tuple[str, int, str]] = []
        self._traced: Optional[tuple[Any, "torch._C.Graph"]] = None  # (tracing state, its graph): graph() costs ~20 µs
        self._thread = threading.get_ident()
        self._others = warnings.showwarning

    def __call__(self, message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if threading.get_ident() != self._thread:
            self._others(message, category, filename, lineno, file, line)
            return
        self.caught.append(warnings.WarningMessage(message, category, filename, lineno, file, line))
        state = torch._C._get_tracing_state()
        if state is None or not issubclass(category, TracerWarning) or "Converting a tensor to a Python" not in str(message):
            return
        if self._traced is None or self._traced[0] is not state:
            self._traced = (state, state.graph())
        if _depends_on_data(self._traced[1].return_node().prev(), self.user_inputs):
            module = innermost_module(stack_frames(inspect.currentframe()), self.names)
            self.data_dependent.append((filename, lineno, self.names[module] if module is not None else ""))
