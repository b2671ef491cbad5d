"""The memory a run holds, storage by storage: when each was allocated, by which module, in which
phase, when it was freed, and which of them autograd saved for the backward.

The run is a training step or an inference call on fake tensors (:mod:`jitflops.estimates.memory_footprint`
makes them), so nothing is allocated. A dispatch mode sees every op's outputs; each new storage is
a :class:`StorageLife`, and a weak reference on it notes the moment it is freed, as torch's own
``MemTracker`` does (its peak is the same, byte for byte, on the models ``tools/memory_accuracy.py``
runs). FSDP2 frees and re-allocates its unsharded parameters by resizing their storages, which no
op shows: ``UntypedStorage.resize_`` is watched while recording. Saved-tensor hooks name the
storages autograd keeps for the backward, with the module that saved them.

Storages are counted at their size (``nbytes``): a CPU allocation. The CUDA caching allocator rounds
each block up to 512 bytes; :attr:`MemoryRecording.rounding` says which was used.
"""

from __future__ import annotations

import sys
import weakref
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..frontends.storage_spans import tensor_storage

SETUP, FORWARD, BACKWARD, OPTIMIZER = "setup", "forward", "backward", "optimizer"
_RETURN_THEIR_INPUT = {torch.ops._c10d_functional.wait_tensor.default}
"""Ops that return their first input in eager, a new tensor under fake tensors (a functional
collective's wait: counted as a second buffer it made a tensor-parallel peak 2 MB, 25%, too high)."""


@dataclass
class StorageLife:
    """One storage: its bytes, the clock ticks it was allocated and freed at (None: alive at the end),
    the innermost module running and the phase when it was allocated."""

    nbytes: int
    born: int
    module: str
    phase: str
    died: Optional[int] = None

    def alive_at(self, tick: int) -> bool:
        return self.born <= tick and (self.died is None or self.died > tick)


@dataclass
class ModuleCall:
    """One forward call of a module: the ticks it started and ended at."""

    module: str
    start: int
    end: int = -1


@dataclass
class MemoryRecording:
    """What :class:`MemoryRecorder` saw (a pure record, read by :mod:`jitflops.estimates.memory_footprint`)."""

    lives: list[StorageLife] = field(default_factory=list)
    calls: list[ModuleCall] = field(default_factory=list)
    saved: dict[int, str] = field(default_factory=dict)
    """Lives (their index) that autograd saved for the backward in the forward, and the module saving each first."""
    phase_starts: dict[str, int] = field(default_factory=dict)
    rounding: int = 1
    ticks: int = 0

    def rounded(self, nbytes: int) -> int:
        return -(-nbytes // self.rounding) * self.rounding if nbytes else 0


class MemoryRecorder(TorchDispatchMode):
    """Records the storages of a run: enter it around the run, with :meth:`phase` around each part."""

    def __init__(self, module_names: dict[nn.Module, str], rounding: int = 1) -> None:
        super().__init__()
        self.recording = MemoryRecording(rounding=rounding)
        self._module_names = module_names
        self._running: list[str] = []
        self._calls_running: list[ModuleCall] = []
        self._phase = SETUP
        self._failed_in: Optional[tuple[BaseException, str]] = None
        """The last exception that left a module's forward, and the first module it left."""
        self._live: dict[int, tuple[int, weakref.ref]] = {}
        """id of a live storage -> (its life's index, a weak reference whose callback frees it)."""
        self._holders: dict[int, int] = {}
        """A life's index -> how many live storages hold it (more than one where a fake op's output is its input in eager)."""

    # -- storages ----------------------------------------------------------------------------
    def _tick(self) -> int:
        self.recording.ticks += 1
        return self.recording.ticks

    def track(self, tensor: Any) -> Optional[int]:
        """The life of ``tensor``'s storage (a new one where it is not tracked yet); None for a non-tensor."""
        if not isinstance(tensor, torch.Tensor):
            return None
        storage = tensor_storage(tensor)
        if storage is None:
            return None
        key = id(storage)
        if key in self._live:
            return self._live[key][0]
        return self._born(storage, storage.nbytes())

    def _born(self, storage: torch.UntypedStorage, nbytes: int) -> int:
        lives = self.recording.lives
        index = len(lives)
        lives.append(StorageLife(self.recording.rounded(nbytes), self._tick(), self._running[-1] if self._running else "", self._phase))
        self._hold(storage, index)
        return index

    def _hold(self, storage: torch.UntypedStorage, index: int) -> None:
        key = id(storage)
        self._live[key] = (index, weakref.ref(storage, lambda _ref, key=key, index=index: self._died(key, index)))
        self._holders[index] = self._holders.get(index, 0) + 1

    def _died(self, key: int, index: int) -> None:
        if self._live.get(key, (None,))[0] == index:
            del self._live[key]
        self._holders[index] -= 1
        life = self.recording.lives[index]
        if life.died is None and not self._holders[index]:
            life.died = self._tick()

    def _resized(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        """A storage resized in place (FSDP2 frees an unsharded parameter so): the old life ends, a new one starts."""
        key = id(storage)
        if key in self._live:
            index, _ = self._live.pop(key)
            self._died(key, index)
        if nbytes:
            self._born(storage, nbytes)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        output = func(*args, **(kwargs or {}))
        if func in _RETURN_THEIR_INPUT:
            self._same_storage(output, args[0])
        for leaf in pytree.tree_leaves(output):
            self.track(leaf)
        return output

    def _same_storage(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        """``output``'s storage held as ``tensor``'s: eager returns the very tensor, a fake one a new one."""
        storage, index = tensor_storage(output), self.track(tensor)
        if storage is not None and index is not None and id(storage) not in self._live:
            self._hold(storage, index)

    # -- scopes, phases, saved tensors ---------------------------------------------------------
    def _entered(self, module: nn.Module, _input: Any) -> None:
        name = self._module_names.get(module)
        if name is not None:
            self._running.append(name)
            call = ModuleCall(name, self._tick())
            self._calls_running.append(call)
            if self._phase == FORWARD:
                self.recording.calls.append(call)

    def _left(self, module: nn.Module, _input: Any, _output: Any) -> None:
        name = self._module_names.get(module)
        if name is not None and self._running and self._running[-1] == name:
            # an always-called hook, called while an exception is handled: the first module that exception left
            # (one handled outside a module's forward, around its call, is another: GroupViT's vision tower)
            unwinding = sys.exc_info()[1]
            if unwinding is not None and (self._failed_in is None or self._failed_in[0] is not unwinding):
                self._failed_in = (unwinding, name)
            self._running.pop()
            self._calls_running.pop().end = self._tick()

    def failed_module(self, error: BaseException) -> str:
        """The innermost module whose forward ``error`` left ("" for the model, or none running)."""
        if self._failed_in is not None and self._failed_in[0] is error:
            return self._failed_in[1]
        return self._running[-1] if self._running else ""

    def _packed(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._phase == FORWARD:
            index = self.track(tensor)
            if index is not None:
                self.recording.saved.setdefault(index, self._running[-1] if self._running else "")
        return tensor

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._phase = name
        self.recording.phase_starts[name] = self._tick()
        try:
            if name == FORWARD:
                with torch.autograd.graph.saved_tensors_hooks(self._packed, lambda tensor: tensor):
                    yield
            else:
                yield
        finally:
            self._phase = SETUP

    def __enter__(self) -> "MemoryRecorder":
        self._stack = ExitStack()
        self._stack.enter_context(_resizes_watched(self._resized))
        self._stack.callback(register_module_forward_pre_hook(self._entered).remove)
        self._stack.callback(register_module_forward_hook(self._left, always_call=True).remove)
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._stack.close()


@contextmanager
def _resizes_watched(on_resize: Callable[[torch.UntypedStorage, int], None]) -> Iterator[None]:
    """``UntypedStorage.resize_`` reported to ``on_resize`` (after it ran) while inside."""
    original = torch.UntypedStorage.resize_

    def resize_(storage: torch.UntypedStorage, nbytes: int) -> Any:
        result = original(storage, nbytes)
        on_resize(storage, int(nbytes))
        return result

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]
