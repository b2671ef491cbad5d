"""The Python bytecode a model's own code runs around its ops, counted as a recording runs it.

An eager step costs its host more than a call per op and per module: the model's Python between
them (transformers' cache updates, mask checks, output dataclasses, ``nn.Module.__getattr__``'s
lookups). A decode step of a two-layer Llama of width 16 took 0.41 ms on a 2-core EPYC, priced at
0.25 ms from its ops and its modules' calls; its own Python ran 9,322 bytecode instructions
between them (0.12 ms at 13 ns each).
The count is deterministic (the same code, the same instructions), so it is counted like FLOPs,
by ``sys.settrace`` with opcode events over the recorded forward, and priced per instruction
(``host_s["bytecode"]``, which ``jitflops calibrate`` times).

What runs under a recording that an eager run does not is left out: the recorder's own code and
hooks (this package's recording code, torch's ``ModuleTracker``, its dispatch and function modes, which
pause the count while they work on an op), torch's meta
kernels and decompositions written in Python (a meta copy's ops run them), and ``nn.Module``'s call
machinery, priced per module call (``host_s["module"]``). Where another trace function is set (a
debugger, a coverage run), nothing is counted: it keeps its trace. On Python 3.13 and later, whose
``sys.settrace`` sends a frame's opcode events only in part (6 of a 9-instruction function's, none
of the first frame's), nothing is counted either (:data:`COUNTS_ON_THIS_PYTHON`).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

_TORCH = Path(torch.__file__).parent
_TORCH_NN = os.path.join(_TORCH, "nn", "")
_OWN = tuple(os.path.join(Path(__file__).parent.parent, folder, "") for folder in ("core", "frontends", "engine", "handles"))
"""The folders of this package a recording runs: its examples' models, calibration's and the optimizer's step module are counted."""

NOT_EAGER_CODE = tuple(os.path.join(_TORCH, *path.split("/")) for path in (
    "_meta_registrations.py", "_refs/", "_prims/", "_prims_common/", "_decomp/", "_subclasses/", "_ops.py", "overrides.py",
    "utils/_python_dispatch.py", "utils/module_tracker.py", "autograd/graph.py"))
"""Torch's files whose code a recording runs and an eager run on a device does not (path
prefixes): what their code calls is not counted either (the meta kernels' checks)."""


COUNTS_ON_THIS_PYTHON = sys.version_info < (3, 13)
"""Whether ``sys.settrace`` sends every instruction's opcode event here: up to Python 3.12 (3.12
once a frame has asked for them before the trace is set, which :class:`BytecodeCounter` does)."""


def _with_nested(code: CodeType) -> Iterator[CodeType]:
    yield code
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            yield from _with_nested(constant)


MODULE_CALL = frozenset(code for method in (nn.Module._call_impl, nn.Module._wrapped_call_impl) for code in _with_nested(method.__code__))
"""A module's call, priced per call elsewhere (``host_s["module"]``), the functions nested in it
included (its path for hooks, which a recording's module tracker sets). What it calls is counted,
called from anywhere: the model's call."""


def _module_call_machinery(frame: FrameType) -> bool:
    """Whether ``frame`` is torch's code a module's call runs besides the module's forward (outside
    ``torch.nn``: the checks of its path for hooks, ``torch.compiler.is_compiling``), which a call
    without hooks skips: a recording's module tracker sets hooks."""
    caller = frame.f_back
    return (caller is not None and caller.f_code in MODULE_CALL and frame.f_code.co_filename.startswith(str(_TORCH))
            and not frame.f_code.co_filename.startswith(_TORCH_NN))


class BytecodeCounter:
    """Counts the bytecode instructions run while it is entered below a module's call: outside
    :data:`MODULE_CALL`, and outside :data:`NOT_EAGER_CODE` and this package's recording code (its
    modes' and module tracker's included), and what they call but a module; :meth:`take` gives
    those since the last take."""

    def __init__(self) -> None:
        self.count = 0
        self._taken = 0
        self._active = False
        self._kinds: dict[CodeType, str] = {}
        self._counting = [False]
        """Whether the code running counts, one entry per module call or uncounted frame running."""

    def take(self) -> int:
        """The instructions counted since the last call."""
        taken, self._taken = self.count - self._taken, self.count
        return taken

    def _kind(self, code: CodeType) -> str:
        kind = self._kinds.get(code)
        if kind is None:
            if code in MODULE_CALL:
                kind = "module"
            elif code.co_filename.startswith((*NOT_EAGER_CODE, *_OWN)):
                kind = "not eager"
            else:
                kind = "counted"
            self._kinds[code] = kind
        return kind

    def _on_call(self, frame: FrameType, event: str, arg: Any) -> Optional[Callable[..., Any]]:
        if event != "call":
            return None
        kind = self._kind(frame.f_code)
        if kind == "counted" and _module_call_machinery(frame):
            kind = "not eager"
        if kind == "module" or (kind == "not eager" and self._counting[-1]):
            self._counting.append(kind == "module")
            return self._on_uncounted_return
        if kind == "not eager" or not self._counting[-1]:
            return None
        frame.f_trace_opcodes = True
        return self._on_opcode

    def _on_uncounted_return(self, frame: FrameType, event: str, arg: Any) -> Optional[Callable[..., Any]]:
        if event == "return":
            self._counting.pop()
        return self._on_uncounted_return

    def _on_opcode(self, frame: FrameType, event: str, arg: Any) -> Optional[Callable[..., Any]]:
        if event == "opcode":
            self.count += 1
        return self._on_opcode

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No trace function while the body runs (the recorder's own work on an op: the meta
        kernels' Python runs many frames, and a trace function's call on each made a prediction of
        Llama-8B on meta 2.9 times as long); the frames running keep theirs, and go on counting after it."""
        if not self._active:
            yield
            return
        sys.settrace(None)
        try:
            yield
        finally:
            sys.settrace(self._on_call)

    def __enter__(self) -> "BytecodeCounter":
        self._active = COUNTS_ON_THIS_PYTHON and sys.gettrace() is None
        if self._active:
            asking = sys._getframe()
            asking.f_trace_opcodes = True  # Python 3.12 sends opcode events only where a frame had asked before the trace was set
            sys.settrace(self._on_call)
            asking.f_trace_opcodes = False
        return self

    def __exit__(self, *args: Any) -> None:
        if self._active:
            sys.settrace(None)
            self._active = False
