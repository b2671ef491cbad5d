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

A recorder that sees every aten op (the dispatch front end) takes a snapshot without copies
(``values_on_write``) and calls :meth:`ModelSnapshot.save_before_write` with each tensor an op is
about to write: only what a forward writes is copied, just before it is written. A write that no op
declares (through ``.numpy()`` or a raw pointer) is then not seen; one that bumps the version counter
is still reported by the warning.

:func:`preserved` also forks the random number generators, so an extra forward (dropout in
training mode) leaves the user's random sequence where it was; pauses Python's cyclic garbage
collector, as ``timeit`` does (:func:`collector_paused`); and holds :data:`RECORDING_LOCK`:
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
from typing import Any, Callable, ContextManager, Iterator, Optional, Union

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.parameter import UninitializedTensorMixin
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


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


@dataclass(slots=True)
class _TensorState:
    name: str
    """``"parameter:weight"``, ``"buffer:running_mean"``."""
    tensor: torch.Tensor
    version: int
    requires_grad: bool
    grad: Optional[torch.Tensor]
    value: Optional[torch.Tensor]
    """A copy of the values, or None where none was taken (uninitialised, or over the budget)."""
    uninitialized: Optional[tuple[type, torch.device, torch.dtype]] = None
    """A lazy module's uninitialised parameter or buffer: its class, device and dtype."""


@dataclass(slots=True)
class _ModuleState:
    module: nn.Module
    cls: type
    scripted: bool
    attributes: dict[str, Any]
    """A shallow copy of the module's ``__dict__``: every attribute, the training flag included."""
    containers: list[tuple[Any, Any]]
    """Its parameter, buffer, child and hook containers, and its list, dict and set attributes,
    where they hold something, each with a copy of its contents."""
    empty: list[Any]
    """The same containers where they were empty (most hook containers): cleared if filled."""
    tensors: list[_TensorState]


_CONTAINER_TYPES = frozenset({list, dict, set})


def _put_back_contents(container: Any, contents: Any) -> None:
    container.clear()
    if isinstance(container, list):
        container.extend(contents)
    else:
        container.update(contents)


def _containers(module: nn.Module, attributes: dict[str, Any], tables: tuple[str, ...]) -> list[Any]:
    """The module's containers a forward may fill or empty: its tables named in ``tables``, and, on a
    module not of torch's own (which keep no such state), its list, dict and set attributes."""
    live = [value for name in tables if (value := attributes.get(name)) is not None]
    if not type(module).__module__.startswith("torch."):
        live += [value for name, value in attributes.items() if type(value) in _CONTAINER_TYPES and name not in _MODULE_DICTS]
    return live


def _is_scripted(module: nn.Module) -> bool:
    return isinstance(module, torch.jit.ScriptModule)


class ModelSnapshot:
    """The restorable state of a model and all its submodules.

    Taken and restored around every recording, so it is kept cheap: one pass over the modules, each
    container's contents copied only where it holds something (most hook containers are empty).
    """

    def __init__(self, model: nn.Module, values_on_write: bool = False) -> None:
        self._model = model
        self._values_on_write = values_on_write
        budget = [PARAMETER_COPY_BUDGET]
        self._states = [self._take(module, budget, values_on_write) for module in model.modules()]
        self._by_storage: Optional[dict[int, list[_TensorState]]] = None
        """Where values are copied on write: each tensor not copied yet, under the address of its
        storage; made at the first write (many forwards write nothing in place)."""

    def save_before_write(self, tensor: torch.Tensor) -> None:
        """An op is about to write ``tensor``: copy the values of the model's tensors that share its
        storage, if not copied yet."""
        if self._by_storage is None:
            self._by_storage = {}
            for saved in (saved for state in self._states for saved in state.tensors if saved.uninitialized is None):
                address = _storage_address(saved.tensor)
                if address is None:  # no storage to watch (a sparse tensor, a wrapper subclass): copied now
                    saved.value = saved.tensor.detach().clone()
                elif address:
                    self._by_storage.setdefault(address, []).append(saved)
        address = _storage_address(tensor)
        for saved in self._by_storage.pop(address, ()) if address else ():
            saved.value = saved.tensor.detach().clone()

    @staticmethod
    def _tensor_state(name: str, tensor: torch.Tensor, copy: bool) -> _TensorState:
        if isinstance(tensor, UninitializedTensorMixin):
            return _TensorState(name, tensor, 0, tensor.requires_grad, None, None, (type(tensor), tensor.device, tensor.dtype))
        value = tensor.detach().clone() if copy and not tensor.is_meta else None
        return _TensorState(name, tensor, tensor._version, tensor.requires_grad, tensor.grad, value)

    @classmethod
    def _take(cls, module: nn.Module, budget: list[int], values_on_write: bool) -> _ModuleState:
        tensors = []
        for name, buffer in module._buffers.items():
            if buffer is not None:
                tensors.append(cls._tensor_state("buffer:" + name, buffer, copy=not values_on_write))
        for name, parameter in module._parameters.items():
            if parameter is not None:
                size = 0 if isinstance(parameter, UninitializedTensorMixin) else parameter.numel() * parameter.element_size()
                copy = not values_on_write and size <= budget[0]
                budget[0] -= size if copy else 0
                tensors.append(cls._tensor_state("parameter:" + name, parameter, copy))
        if _is_scripted(module):  # its attributes live in C++: values only
            return _ModuleState(module, type(module), True, {}, [], [], tensors)
        attributes = dict(vars(module))
        live = _containers(module, attributes, _MODULE_DICTS)
        containers = [(container, container.copy()) for container in live if container]
        return _ModuleState(module, type(module), False, attributes, containers, [container for container in live if not container], tensors)

    def restore(self) -> None:
        unrestorable = []
        with torch.no_grad():  # kernels such as batch norm update buffers without bumping their version
            for state in self._states:
                if not state.scripted:
                    self._restore_attributes(state)
                for saved in state.tensors:
                    if not self._restore_tensor(saved):
                        unrestorable.append((state.module, saved.name.partition(":")[2]))
        if unrestorable:
            names = {module: name for name, module in self._model.named_modules(remove_duplicate=False)}
            unrestorable = [f"{names.get(module, '?')}.{attribute}".lstrip(".") for module, attribute in unrestorable]
            why = "written where no op declared it, as through .numpy()" if self._values_on_write else f"copies are kept only for {PARAMETER_COPY_BUDGET // 2**20} MiB of parameters"
            warnings.warn(
                f"the forward changed values in place that jitflops could not put back ({why}): {', '.join(unrestorable)}",
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
        for container, saved in state.containers:
            _put_back_contents(container, saved)
        if any(state.empty):
            for container in state.empty:
                container.clear()

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
        if tensor.requires_grad != saved.requires_grad:
            tensor.requires_grad_(saved.requires_grad)
        if tensor.grad is not saved.grad:
            tensor.grad = saved.grad
        if tensor._version == saved.version and saved.value is None:
            return True
        if saved.value is None:
            return False
        # Batch norm's kernels and ``.data`` write without bumping the version: compare the values.
        # Copy only where they changed: a copy bumps the version, which would break a backward
        # pass that saved this tensor (the profiler counts inside a training step's forward).
        changed = tensor._version != saved.version
        for current, value in zip(_plain_parts(tensor), _plain_parts(saved.value)):
            if changed or not torch.equal(current, value):
                current.copy_(value)
        return True


def _plain_parts(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors that hold a tensor's values: itself, or a wrapper subclass's inner tensors
    (``__tensor_flatten__``), compared and copied one by one. A subclass's own ``equal`` and
    ``copy_`` are not run: DTensor's would all-reduce the answer (a collective some ranks would
    skip), and torchao's quantized tensors implement neither."""
    if not is_traceable_wrapper_subclass(tensor):
        return [tensor]
    names, _ = tensor.__tensor_flatten__()
    inner = (getattr(tensor, name) for name in names)  # DTensor also lists its (opaque) device mesh
    return [part for value in inner if isinstance(value, torch.Tensor) for part in _plain_parts(value)]


def _storage_address(tensor: torch.Tensor) -> Optional[int]:
    """The address of the storage ``tensor`` views, the same for a parameter, its ``.data`` and every
    view of either (0 on the meta device); None where there is no storage to read (a sparse tensor, a
    wrapper subclass, a fake tensor: none of the model's)."""
    if isinstance(tensor, FakeTensor):
        return None
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _cuda_devices(model: nn.Module) -> list[int]:
    if not torch.cuda.is_available():
        return []
    return sorted({t.device.index or 0 for t in list(model.parameters()) + list(model.buffers()) if t.device.type == "cuda"})


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the body, then back as it was.

    A count makes Python objects by the thousand (graph node wrappers, records, snapshots), most of
    which live until it ends: each collection they trigger walks them again, and with a large
    library imported a full one walks every object of the process (ResNet-50's snapshot alone:
    1.6 ms with the collector paused, 3.8 ms without)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_collected_in_full = False
"""Whether this process has had the full collection a first recording with collectives gets."""


@contextmanager
def own_cycles_collected(needed: Callable[[], bool]) -> Iterator[None]:
    """After the body, when ``needed()`` says so, collect the reference cycles made in it, and only
    those: the objects that existed before are frozen (``gc.freeze``) for that collection, so it walks
    the body's objects, not every object of the process (with torch.distributed imported a full
    collection walks some 300,000 objects: 0.2 s a time on a CPU core). The first such collection of
    a process is a full one, and so is every one where the process froze objects itself (unfreezing
    would undo its freeze): a sharded model's set-up leaves garbage of its own (device meshes,
    DTensor's fake-tensor modes), and a rank whose process kept it to its exit aborted there (1 suite run in 8)."""
    global _collected_in_full
    freezes = gc.get_freeze_count() == 0 and _collected_in_full
    if freezes:
        gc.freeze()
    try:
        yield
    finally:
        try:
            if needed():
                gc.collect()
                _collected_in_full = _collected_in_full or not freezes
        finally:
            if freezes:
                gc.unfreeze()


class SharedContainers:
    """What a forward on a copy of the model made by :func:`~jitflops.frontends.meta_values.empty_copy`
    could change of the model itself: the containers the copy shares with it (its hook tables, the
    set of non-persistent buffers, the list, dict and set attributes of modules not of torch's own).
    The copy's own attributes, parameters, buffers and children are its own, so this snapshot is a
    tenth of a :class:`ModelSnapshot`'s cost (0.07 against 0.8 ms on a 175-module CNN)."""

    def __init__(self, copy: nn.Module) -> None:
        self._saved = [(container, container.copy() if container else None)
                       for module in copy.modules() for container in _containers(module, vars(module), _SHARED_TABLES)]

    def save_before_write(self, tensor: torch.Tensor) -> None:
        """Nothing to copy: the copy's tensors are its own."""

    def restore(self) -> None:
        for container, contents in self._saved:
            if contents is not None:
                _put_back_contents(container, contents)
            elif container:
                container.clear()


_SHARED_TABLES = tuple(name for name in _MODULE_DICTS if name not in ("_parameters", "_buffers", "_modules"))
"""The tables a copy made by ``empty_copy`` shares with the model (it has its own parameters,
buffers and children)."""


@contextmanager
def _restored(model: nn.Module, take: Callable[[], Union[ModelSnapshot, SharedContainers]]) -> Iterator[Any]:
    with RECORDING_LOCK, collector_paused():
        snapshot = take()
        try:
            with torch.random.fork_rng(devices=_cuda_devices(model)):
                yield snapshot
        finally:
            snapshot.restore()


def preserved(model: nn.Module, values_on_write: bool = False) -> ContextManager[ModelSnapshot]:
    """Run the body holding :data:`RECORDING_LOCK`, with the garbage collector paused, then restore
    ``model`` (and the random generators) to the state they had before, also if the body raised or
    was interrupted. Yields the snapshot (see :meth:`ModelSnapshot.save_before_write`)."""
    return _restored(model, lambda: ModelSnapshot(model, values_on_write))


def preserved_through_copy(copy: nn.Module) -> ContextManager[SharedContainers]:
    """:func:`preserved` for a body that runs ``copy``, made by ``empty_copy`` of the user's model:
    what the copy shares with the model is put back (:class:`SharedContainers`)."""
    return _restored(copy, lambda: SharedContainers(copy))
