"""The path a model takes when traced, taken without the tracer.

Models ask whether they are traced, and take another path when they are: ``torch.jit.is_tracing()``
is asked by 90 of transformers' modules (a position embedding interpolated only when traced, a
causal mask kept only when traced, a padding mask's values read only when not traced) and by
torch's own functions. Code that runs a model to learn what its trace will do (the count read from
the model's calls, the untraced run before a trace on meta values) must take the trace's path, or
it records other ops, or fails on a value read the trace never makes.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import torch

from ..core.model_guard import RECORDING_LOCK


@contextmanager
def on_the_traced_path() -> Iterator[None]:
    """For the body, in the calling thread, ``torch.jit.is_tracing()`` answers True, as it does
    under the tracer; other threads get torch's own answer. The tracer's state stays unset: every
    reader of it in torch and transformers then takes a path that reads no tensor's value. Holds
    :data:`~jitflops.core.model_guard.RECORDING_LOCK` (the answer is process-wide)."""
    with RECORDING_LOCK:
        answer, thread = torch.jit.is_tracing, threading.get_ident()

        def is_tracing() -> bool:
            return threading.get_ident() == thread or answer()

        torch.jit.is_tracing = is_tracing
        try:
            yield
        finally:
            torch.jit.is_tracing = answer
