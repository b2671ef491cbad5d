"""The pages glibc's heap faults in, op by op, when a CPU runs a training step again and again.

A CPU tensor is a ``posix_memalign`` block of glibc's main arena. glibc serves a block from a free one
of its heap that fits (the smallest), else from the heap's top, which it grows; a block of at least
its mmap threshold that the top cannot hold gets pages mapped for it instead. Freeing such a mapped
block raises the threshold to its size (up to 32 MiB), and the trim threshold to twice that; freeing
a large block while the top's free space reaches the trim threshold hands that space back to the OS
(``systrim``). A page the heap takes again, or a mapped block's, is faulted in at its first write.

A training step frees most of what it allocates: AdamW's temporaries a parameter at a time, the
gradients at ``zero_grad``, the forward's activations through the backward. In a loop, the heap
grows to the step's peak and is trimmed back as the step ends, or in the middle of it, and the
next step faults the same pages in again.

The model replays the step's storage spans (:mod:`jitflops.frontends.storage_spans`) a few times
from an empty heap and counts each op's faults in the last replay. Replayed through glibc itself
(``posix_memalign``, each block written, ``free``, in the same order), the same steps faulted -7%
to +6% of its count on a 2-core EPYC VM (an MLP, T5-small, BERT-base; Llama GQA's 2-layer step
-14%). A real loop faulted 0.74 to 1.03 times it (T5-small 148 K pages a step against 142 K, where
outputs of 32 MiB and more alone are 96 K; Llama GQA's half): its heap holds the interpreter's and
the libraries' blocks too (150 to 190 MB, 11 to 22 MB of them free), which can take a tensor. A
forward alone is priced by :func:`~jitflops.estimates.costs.fresh_pages.fresh_pages` instead: its
tensors are small, and those other blocks decide where they land (ViT-B/16's forward faulted 0.6
to 3.7 K pages in a process of its own, this model fed its real allocations 13.8 K).
"""

from __future__ import annotations

import bisect
import math
from typing import Hashable, Iterator, Sequence

from ..frontends.dispatch_trace import DispatchTrace
from .costs.fresh_pages import FRESH_PAGES_FROM_BYTES, PAGE_BYTES

HEADER_BYTES = 16
"""A chunk's size field and the one before it (64-bit)."""
ALIGNMENT = 64
"""c10's CPU allocator aligns each block to 64 bytes (``posix_memalign``)."""
SMALLEST_CHUNK = 32
TOP_PAD = 128 * 1024
"""What glibc grows the heap by beyond a request, and leaves at the top when it trims (``M_TOP_PAD``)."""
CONSOLIDATION_BYTES = 64 * 1024
"""Freeing a block at least this large (after merging with its free neighbours) checks the top for trimming (``FASTBIN_CONSOLIDATION_THRESHOLD``)."""
FIRST_THRESHOLD = 128 * 1024
"""The mmap and trim thresholds a process starts with (``DEFAULT_MMAP_THRESHOLD_MIN``, ``DEFAULT_TRIM_THRESHOLD``)."""
REPLAYS = 3
"""Steps replayed: the first raises the thresholds, the last is the steady one counted."""


def chunk_bytes(nbytes: int) -> int:
    """The heap chunk a block of ``nbytes`` takes."""
    return max(SMALLEST_CHUNK, math.ceil((nbytes + HEADER_BYTES) / ALIGNMENT) * ALIGNMENT)


def _pages(nbytes: int) -> int:
    return math.ceil(nbytes / PAGE_BYTES)


class MainArena:
    """glibc's main arena, as blocks are allocated and freed: counts the pages faulted in."""

    def __init__(self) -> None:
        self.mmap_threshold = self.trim_threshold = FIRST_THRESHOLD
        self.top = self.end = 0
        """The top chunk's start, and the heap's end (``brk``)."""
        self.touched = 0
        """The end of the heap's pages written since it was last trimmed below them."""
        self._free: dict[int, int] = {}
        self._starts: list[int] = []
        self._blocks: dict[Hashable, tuple[int, int]] = {}
        """A live block -> (its chunk's start, -1 where mapped; its size)."""

    def allocate(self, block: Hashable, nbytes: int) -> int:
        """The pages faulted in serving ``block`` (an id) of ``nbytes``."""
        size = chunk_bytes(nbytes)
        fitting = [start for start in self._starts if self._free[start] >= size]
        if fitting:
            start = min(fitting, key=lambda start: (self._free[start], start))
            self._take(start, size)
        elif self.end - self.top >= size + SMALLEST_CHUNK or size < self.mmap_threshold:
            start, self.top = self.top, self.top + size
            if self.top + SMALLEST_CHUNK > self.end:
                self.end = math.ceil((self.top + TOP_PAD) / PAGE_BYTES) * PAGE_BYTES
        else:
            self._blocks[block] = (-1, _pages(size + HEADER_BYTES) * PAGE_BYTES)
            return _pages(size)
        self._blocks[block] = (start, size)
        first_new = max(start // PAGE_BYTES, _pages(self.touched))  # the page the written part ends in is mapped already
        self.touched = max(self.touched, start + size)
        return max(0, _pages(start + size) - first_new)

    def _take(self, start: int, size: int) -> None:
        free = self._free.pop(start)
        self._starts.remove(start)
        if free - size >= SMALLEST_CHUNK:
            self._add_free(start + size, free - size)

    def _add_free(self, start: int, size: int) -> None:
        self._free[start] = size
        bisect.insort(self._starts, start)

    def release(self, block: Hashable) -> None:
        start, size = self._blocks.pop(block)
        if start < 0:  # munmap: the thresholds rise to the block's size
            if self.mmap_threshold < size <= FRESH_PAGES_FROM_BYTES:
                self.mmap_threshold, self.trim_threshold = size, 2 * size
            return
        end = start + size
        at = bisect.bisect_left(self._starts, start)
        if at and self._starts[at - 1] + self._free[self._starts[at - 1]] == start:
            start = self._starts[at - 1]
            self._starts.pop(at - 1)
            del self._free[start]
        if end in self._free:
            self._starts.remove(end)
            end += self._free.pop(end)
        if end == self.top:
            self.top = start
        else:
            self._add_free(start, end - start)
        if end - start >= CONSOLIDATION_BYTES and self.end - self.top >= self.trim_threshold:
            kept = math.ceil((self.top + TOP_PAD + SMALLEST_CHUNK) / PAGE_BYTES) * PAGE_BYTES
            self.end = min(self.end, kept)
            self.touched = min(self.touched, self.end)


def step_events(traces: Sequence[DispatchTrace]) -> Iterator[tuple[int, bool, int, int]]:
    """(op, whether allocated, block, bytes) in the order the step runs: the traces one after the
    other, at each op the frees before it and then its outputs; what is alive after a trace's last op
    is freed at the step's end (the gradients at ``zero_grad``, which the recording hands back as
    it ends; the output as the loop drops it)."""
    op = block = 0
    survivors: list[int] = []
    for trace in traces:
        first = block
        by_op: dict[int, list[tuple[bool, int, int]]] = {}
        for index, span in enumerate(trace.storages):
            by_op.setdefault(span.made_by, []).append((True, first + index, span.nbytes))
            if span.freed_before is None or span.freed_before >= len(trace.records):
                survivors.append(first + index)
            else:
                by_op.setdefault(span.freed_before, []).append((False, first + index, span.nbytes))
        for index in range(len(trace.records)):
            events = by_op.get(index, ())
            for allocated, each, nbytes in sorted(events, key=lambda event: event[0]):  # frees first
                yield op + index, allocated, each, nbytes
        op += len(trace.records)
        block = first + len(trace.storages)
    for each in survivors:
        yield op, False, each, 0


def heap_pages(traces: Sequence[DispatchTrace], lasting: Sequence[int] = (), replays: int = REPLAYS) -> dict[int, int]:
    """The pages each op of ``traces`` (one step's recordings, in the order they run) faults in, in a
    loop's steady step, by ``id`` of its record; the records with none are left out. ``lasting``:
    the bytes of the blocks the first step makes before its last recording's ops and keeps (an
    optimizer's state): where they land in the heap, it cannot be trimmed below them."""
    records = [record for trace in traces for _, record in trace.records]
    events = list(step_events(traces))
    arena, pages = MainArena(), [0] * len(records)
    last_starts = len(records) - len(traces[-1].records)
    for replay in range(replays):
        counted = replay == replays - 1
        for op, allocated, block, nbytes in events:
            if replay == 0 and op >= last_starts and lasting:
                for index, each in enumerate(lasting):
                    arena.allocate(("lasting", index), each)
                lasting = ()
            if allocated:
                faulted = arena.allocate((replay, block), nbytes)
                if counted:
                    pages[op] += faulted
            else:
                arena.release((replay, block))
    return {id(record): count for record, count in zip(records, pages) if count}
