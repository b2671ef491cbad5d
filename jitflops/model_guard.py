"""Give the user's model back exactly as it was, whatever happened while it was analysed.

Taken before any analysis or profiling touches a model, a :class:`ModelSnapshot` remembers, for
every submodule, its class (a lazy module changes class when it materialises), its attributes
(list, dict and set attributes by content too), hooks, parameters and buffers (the objects, their
``requires_grad`` and ``.grad``, and their values), children and training flag;
:meth:`ModelSnapshot.restore` puts all of it back. Values are compared through torch's version
counters, so only what a forward changed in place is written back. Parameter values are copied only
while the copies stay within :data:`PARAMETER_COPY_BUDGET` (copying a large model's weights would
cost more than its trace); beyond it a parameter changed in place is reported by a warning that
names it. A scripted submodule keeps its state in C++: only its buffer values are put back.

:func:`preserved` also forks the random number generators, so an extra forward (dropout in
training mode) leaves the user's random sequence where it was; pauses Python's cyclic garbage
collector, as ``timeit`` does (a trace makes Python objects by the thousand, and each collection
they trigger walks the young objects again: 2-3% of a MobileNetV2 trace); and holds :data:`RECORDING_LOCK`:
torch's tracer map, the global module hooks of its ``ModuleTracker`` and Python's warning filters
are process-wide, so recordings run one at a time (other threads keep running their own code).
Used as a context manager it restores on success, on error and on ``KeyboardInterrupt`` alike.
"""

from __future__ import annotations

import gc
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
from torch import nn
from torch.nn.parameter import UninitializedTensorMixin

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

PARAMETER_COPY_BUDGET = 2**20
"""Bytes of parameter values a snapshot copies so that a forward changing them in place is undone."""

RECORDING_LOCK = threading.RLock()
"""Held while a model runs under a front end or a timer: what torch keeps process-wide allows one at a time."""


class ModelChangedWarning(UserWarning):
    """A forward changed something of the model that could not be put back."""


@dataclass
class _TensorState:
    tensor: torch.Tensor
    version: int
    requires_grad: bool
    grad: Optional[torch.Tensor]
    value: Optional[torch.Tensor]
    """A copy of the values, or None where none was taken (uninitialised, or over the budget)."""
    uninitialized: Optional[tuple[type, torch.device, torch.dtype]] = None
    """A lazy module's uninitialised parameter or buffer: its class, device and dtype."""


@dataclass
class _ModuleState:
    module: nn.Module
    cls: type
    attributes: dict[str, Any]
    """A shallow copy of the module's ``__dict__``: every attribute, the training flag included."""
    contents: dict[str, Any]
    """The contents of its non-empty parameter, buffer, child and hook containers, and of its list,
    dict and set attributes."""
    tensors: dict[str, _TensorState]


_CONTAINER_TYPES = frozenset({list, dict, set})


def _copy_contents(container: Any) -> Any:
    if isinstance(container, list):
        return list(container)
    return set(container) if isinstance(container, set) else dict(container)


def _put_back_contents(container: Any, contents: Any) -> None:
    container.clear()
    if isinstance(container, list):
        container.extend(contents)
    else:
        container.update(contents)


def _is_scripted(module: nn.Module) -> bool:
    return isinstance(module, torch.jit.ScriptModule)


class ModelSnapshot:
    """The restorable state of a model and all its submodules."""

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        budget = [PARAMETER_COPY_BUDGET]
        self._states = [self._take(module, budget) for module in model.modules()]

    @staticmethod
    def _tensor_state(tensor: torch.Tensor, copy: bool) -> _TensorState:
        if isinstance(tensor, UninitializedTensorMixin):
            return _TensorState(tensor, 0, tensor.requires_grad, None, None, (type(tensor), tensor.device, tensor.dtype))
        value = tensor.detach().clone() if copy and tensor.device.type != "meta" else None
        return _TensorState(tensor, tensor._version, tensor.requires_grad, tensor.grad, value)

    @classmethod
    def _take(cls, module: nn.Module, budget: list[int]) -> _ModuleState:
        tensors: dict[str, _TensorState] = {}
        for name, buffer in module._buffers.items():
            if buffer is not None:
                tensors[f"buffer:{name}"] = cls._tensor_state(buffer, copy=True)
        for name, parameter in module._parameters.items():
            if parameter is not None:
                size = 0 if isinstance(parameter, UninitializedTensorMixin) else parameter.numel() * parameter.element_size()
                copy = size <= budget[0]
                budget[0] -= size if copy else 0
                tensors[f"parameter:{name}"] = cls._tensor_state(parameter, copy)
        if _is_scripted(module):  # its attributes live in C++: values only
            return _ModuleState(module, type(module), {}, {}, tensors)
        attributes = dict(vars(module))
        # Most hook containers are empty: only non-empty ones are copied, the others are emptied on restore.
        contents = {name: _copy_contents(live) for name in _MODULE_DICTS if (live := attributes.get(name))}
        if not type(module).__module__.startswith("torch."):  # torch's own modules keep no such state
            for name, value in attributes.items():
                if type(value) in _CONTAINER_TYPES and name not in contents:
                    contents[name] = _copy_contents(value)
        return _ModuleState(module, type(module), attributes, contents, tensors)

    def restore(self) -> None:
        unrestorable = []
        with torch.no_grad():  # kernels such as batch norm update buffers without bumping their version
            for state in self._states:
                if not _is_scripted(state.module):
                    self._restore_attributes(state)
                for key, saved in state.tensors.items():
                    if not self._restore_tensor(saved):
                        unrestorable.append((state.module, key.partition(":")[2]))
        if unrestorable:
            names = {module: name for name, module in self._model.named_modules(remove_duplicate=False)}
            unrestorable = [f"{names.get(module, '?')}.{attribute}".lstrip(".") for module, attribute in unrestorable]
            warnings.warn(
                f"the forward changed parameter values in place that jitflops could not put back (copies are kept only for "
                f"{PARAMETER_COPY_BUDGET // 2**20} MiB of parameters): {', '.join(unrestorable)}",
                ModelChangedWarning,
                stacklevel=3,
            )

    @staticmethod
    def _restore_attributes(state: _ModuleState) -> None:
        module = state.module
        if type(module) is not state.cls:
            module.__class__ = state.cls  # a lazy module that materialised
        live_attributes = vars(module)
        live_attributes.clear()
        live_attributes.update(state.attributes)
        for name in _MODULE_DICTS:
            container = state.attributes.get(name)
            saved = state.contents.get(name)
            if container or saved:
                _put_back_contents(container, saved or ())
        for name, saved in state.contents.items():
            if name not in _MODULE_DICTS:
                _put_back_contents(state.attributes[name], saved)

    @staticmethod
    def _restore_tensor(saved: _TensorState) -> bool:
        """Put back a tensor's flags, gradient and, where they changed, values; False where values
        changed and no copy was kept. A lazy module's parameter that materialised (in place: it
        changed class and got data) is made uninitialised again, the same object, as torch's
        ``materialize`` made it initialised."""
        tensor = saved.tensor
        if saved.uninitialized is not None:
            if not isinstance(tensor, UninitializedTensorMixin):
                lazy_class, device, dtype = saved.uninitialized
                tensor.data = torch.empty(0, device=device, dtype=dtype)
                tensor.__class__ = lazy_class
            return True
        tensor.requires_grad_(saved.requires_grad)
        tensor.grad = saved.grad
        if tensor._version == saved.version and saved.value is None:
            return True
        if saved.value is None:
            return False
        # Batch norm's kernels and ``.data`` write without bumping the version: compare the values.
        # Copy only where they changed: a copy bumps the version, which would break a backward
        # pass that saved this tensor (the profiler counts inside a training step's forward).
        if tensor._version != saved.version or not torch.equal(tensor, saved.value):
            tensor.copy_(saved.value)
        return True


def _cuda_devices(model: nn.Module) -> list[int]:
    if not torch.cuda.is_available():
        return []
    return sorted({t.device.index or 0 for t in list(model.parameters()) + list(model.buffers()) if t.device.type == "cuda"})


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the body, then back as it was."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def preserved(model: nn.Module) -> Iterator[None]:
    """Run the body holding :data:`RECORDING_LOCK`, with the garbage collector paused, then restore
    ``model`` (and the random generators) to the state they had before, also if the body raised or
    was interrupted."""
    with RECORDING_LOCK, _collector_paused():
        snapshot = ModelSnapshot(model)
        try:
            with torch.random.fork_rng(devices=_cuda_devices(model)):
                yield
        finally:
            snapshot.restore()
