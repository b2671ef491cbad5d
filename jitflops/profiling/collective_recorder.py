"""Collectives recorded as a training loop runs them, each with its time.

The analyses record a model's collectives from inside its forward and backward, in their module
scopes. Some communication happens outside any module: a pipeline schedule's sends and receives
between stages, an optimizer's all-reduce of the gradient norm. :func:`record_collectives` records
every collective run in its block, with the wall time of the call (on the CPU with gloo, the
collective itself; for an asynchronous op, its launch), and nothing else. It costs one Python call per
op in the block: use it around the steps to measure, as the profiler's schedule does.

>>> with record_collectives() as log:
...     schedule.step(inputs)
>>> log.by_collective()   # {"send": CollectiveTotals(calls=..., bytes=..., seconds=...), ...}
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..engine.communication import CollectiveCall, CollectiveTotals, totals_by_collective
from ..frontends.dispatch_trace import Signature
from ..handles import COMMUNICATION_FORMULAS, collective_of
from ..core.process_groups import dispatches_to_dtensor
from ..core.records import BACKWARD, FORWARD

_COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd"})


class CollectiveLog(TorchDispatchMode):
    """The collectives run while it is active, in order, timed."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[CollectiveCall] = []
        self._signatures: dict[Any, Signature] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if types and dispatches_to_dtensor(types):
            return NotImplemented
        if getattr(func, "namespace", None) not in _COLLECTIVE_NAMESPACES or func._schema.name not in COMMUNICATION_FORMULAS.kinds():
            return func(*args, **kwargs)
        signature = self._signatures.get(func)
        if signature is None:
            signature = self._signatures[func] = Signature.of(func._schema)
        phase = BACKWARD if torch._C._current_autograd_node() is not None else FORWARD
        start = time.perf_counter()
        output = func(*args, **kwargs)
        seconds = time.perf_counter() - start
        self.calls.append(CollectiveCall("", phase, collective_of(signature.record(args, kwargs, output, "", phase)), seconds))
        return output

    def by_collective(self) -> dict[str, CollectiveTotals]:
        """The calls summed per collective (``backward.`` for those run by the autograd engine)."""
        return totals_by_collective(self.calls)


@contextmanager
def record_collectives() -> Iterator[CollectiveLog]:
    """Record every collective run in the block (see the module's docstring)."""
    with CollectiveLog() as log:
        yield log
