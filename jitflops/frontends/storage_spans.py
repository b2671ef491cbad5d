"""The storages a dispatch recording's ops make: each one's bytes, the op whose output it is, and the
op before which it was freed.

A weak reference on each new storage notes the moment it is freed, as torch's ``MemTracker`` does,
so the spans follow the run's own references: an activation autograd saved lives into the backward,
a temporary dies at the op after its last use. A storage an op returns that one of its inputs holds
(a view, an op in place, ``out=``) is not new. The allocator's model of a CPU step reads them
(:mod:`jitflops.estimates.heap_pages`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.utils._pytree import tree_leaves

from ..core.process_groups import is_dtensor


@dataclass(frozen=True)
class StorageSpan:
    """One storage an op made: its bytes, the index of that op, and the index of the first op
    recorded after its free (None: alive when the recording ended)."""

    nbytes: int
    made_by: int
    freed_before: Optional[int] = None


def tensor_storage(tensor: torch.Tensor) -> Optional[torch.UntypedStorage]:
    """A tensor's plain storage, a DTensor's local shard's (None for a sparse or nested tensor, which
    has none)."""
    if is_dtensor(tensor):
        tensor = tensor.to_local()
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


def _storage(value: Any) -> Optional[torch.UntypedStorage]:
    """A dense tensor's storage; None for a DTensor, whose ops are recorded on its local shard."""
    return tensor_storage(value) if isinstance(value, torch.Tensor) and not is_dtensor(value) else None


class StorageSpans:
    """Follows the storages the ops of one recording make: :meth:`after_op` with each op recorded,
    :meth:`spans` when the recording ends."""

    def __init__(self) -> None:
        self._spans: list[list[Optional[int]]] = []
        """[bytes, the op that made it, the op before which it was freed] per storage."""
        self._live: dict[int, weakref.ref] = {}
        self._ops = 0
        self._ended = False

    def after_op(self, index: int, inputs: Any, output: Any) -> None:
        """The storages of the ``index``-th op's output that none of its ``inputs`` holds, followed."""
        self._ops = index + 1
        held = {id(storage) for storage in map(_storage, tree_leaves(inputs)) if storage is not None}
        for storage in map(_storage, tree_leaves(output)):
            if storage is None or id(storage) in held or id(storage) in self._live or not storage.nbytes():
                continue
            key, span = id(storage), len(self._spans)
            self._spans.append([storage.nbytes(), index, None])
            self._live[key] = weakref.ref(storage, lambda _ref, key=key, span=span: self._freed(key, span))

    def _freed(self, key: int, span: int) -> None:
        self._live.pop(key, None)
        if not self._ended:
            self._spans[span][2] = self._ops

    def spans(self) -> tuple[StorageSpan, ...]:
        """The spans so far; a storage freed after this is alive at the recording's end."""
        self._ended = True
        return tuple(StorageSpan(nbytes, made_by, freed_before) for nbytes, made_by, freed_before in self._spans)  # type: ignore[arg-type]
