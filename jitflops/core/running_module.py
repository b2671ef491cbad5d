"""Which of the model's modules was running: when a forward raised, or when something is observed.

Front ends and timers name the failing module in their errors without installing hooks for it:
the innermost frame whose ``self`` is one of the model's modules is the module that was running.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import torch
from torch import nn

from .errors import TraceError


def module_names(aliases: Mapping[Any, str]) -> dict[nn.Module, str]:
    """The modules' names among ``aliases`` (which may name other objects too), as the functions
    here take them."""
    return {module: name for module, name in aliases.items() if isinstance(module, nn.Module)}


def innermost_module(frames: Iterable[FrameType], names: Mapping[nn.Module, str]) -> Optional[nn.Module]:
    """The first of ``frames`` (innermost first) that runs a method of one of the model's modules."""
    for frame in frames:
        owner = frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and owner in names:
            return owner
    return None


def traceback_frames(traceback: Optional[TracebackType]) -> list[FrameType]:
    """The frames of a traceback, innermost first."""
    frames = []
    while traceback is not None:
        frames.append(traceback.tb_frame)
        traceback = traceback.tb_next
    return frames[::-1]


def stack_frames(frame: Optional[FrameType]) -> Iterator[FrameType]:
    """The running frames from ``frame`` outwards."""
    while frame is not None:
        yield frame
        frame = frame.f_back


def hookable_modules(model: nn.Module, names: Mapping[nn.Module, str]) -> Iterator[tuple[nn.Module, str]]:
    """The model's modules that can take forward hooks, with their names: not those a forward added
    (they have no name in the counts) nor scripted ones (they take no hooks)."""
    for module in model.modules():
        name = names.get(module)
        if name is not None and not isinstance(module, torch.jit.ScriptModule):
            yield module, name


def _as_is(failed: nn.Module, error: Exception) -> Exception:
    return error


@contextmanager
def failures_named(
    model: nn.Module,
    names: Mapping[nn.Module, str],
    activity: str,
    explain: Callable[[nn.Module, Exception], Exception] = _as_is,
) -> Iterator[None]:
    """Re-raise an exception of the body as a ``TraceError`` naming the module that was running;
    ``explain`` may replace the cause given the failing module."""
    try:
        yield
    except Exception as error:
        failed = innermost_module(traceback_frames(error.__traceback__), names) or model
        raise TraceError(names.get(failed, ""), type(failed).__name__, explain(failed, error), activity) from error
