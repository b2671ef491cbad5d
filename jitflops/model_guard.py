"""Give the user's model back exactly as it was, whatever happened while it was analysed.

Taken before any analysis or profiling touches a model, a :class:`ModelSnapshot` remembers, for
every submodule, its attributes, hooks, parameters, buffers (and their values), children and
training flag; :meth:`ModelSnapshot.restore` puts all of it back. :func:`preserved` also forks the
random number generators, so an extra forward (dropout in training mode) leaves the user's random
sequence where it was. Used as a context manager it restores on success and on error alike.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn

_MODULE_DICTS = (
    "_parameters",
    "_buffers",
    "_modules",
    "_non_persistent_buffers_set",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


@dataclass
class _ModuleState:
    module: nn.Module
    attributes: dict[str, Any]
    """A shallow copy of the module's ``__dict__``: every attribute, the training flag included."""
    containers: dict[str, Any]
    """The contents of its non-empty parameter, buffer, child and hook containers."""
    buffer_values: dict[str, torch.Tensor]


def _copy_container(container: Any) -> Any:
    return set(container) if isinstance(container, set) else dict(container)


class ModelSnapshot:
    """The restorable state of a model and all its submodules."""

    def __init__(self, model: nn.Module) -> None:
        self._states = [self._take(module) for module in model.modules()]

    @staticmethod
    def _take(module: nn.Module) -> _ModuleState:
        attributes = dict(vars(module))
        # Most hook containers are empty: only non-empty ones are copied, the others are emptied on restore.
        containers = {name: _copy_container(live) for name in _MODULE_DICTS if (live := attributes.get(name))}
        buffers = {name: buffer.detach().clone() for name, buffer in module._buffers.items() if buffer is not None}
        return _ModuleState(module, attributes, containers, buffers)

    def restore(self) -> None:
        with torch.no_grad():  # kernels such as batch norm update buffers without bumping their version
            for state in self._states:
                live_attributes = vars(state.module)
                live_attributes.clear()
                live_attributes.update(state.attributes)
                for name in _MODULE_DICTS:
                    container = state.attributes.get(name)
                    saved = state.containers.get(name)
                    if container or saved:
                        container.clear()
                        container.update(saved or ())
                buffers = state.module._buffers
                for name, value in state.buffer_values.items():
                    buffers[name].copy_(value)


def _cuda_devices(model: nn.Module) -> list[int]:
    if not torch.cuda.is_available():
        return []
    return sorted({t.device.index or 0 for t in list(model.parameters()) + list(model.buffers()) if t.device.type == "cuda"})


@contextmanager
def preserved(model: nn.Module) -> Iterator[None]:
    """Run the body, then restore ``model`` (and the random generators) to the state they had
    before, also if the body raised."""
    snapshot = ModelSnapshot(model)
    try:
        with torch.random.fork_rng(devices=_cuda_devices(model)):
            yield
    finally:
        snapshot.restore()
