"""The pages a CPU op's large output is mapped on afresh, each faulted in at its first write.

glibc serves an allocation of at least 32 MiB (its largest mmap threshold,
``DEFAULT_MMAP_THRESHOLD_MAX`` on a 64-bit machine) from pages mapped for it, unless its heap holds a
free block that large, and hands them back at its free: the op's kernel writes each page for the
first time, and the OS faults it in, zeroed. On a 2-core EPYC a float32 add of 16 Mi elements took
6.9 ms into an output it had, and 21 to 218 ms into a new one (16,385 pages faulted in, 0.9 to 13
us each: the VM's host hands freed pages back and forth), round to round.

Calibration times the kinds priced here on outputs under that size, and the host's time a page
faulted in apart (``host_s["page"]``, :mod:`jitflops.timing.calibration.host`), so a round whose
faults ran slow no longer moves every large op's price, and an op of 16 to 32 MiB is no longer
read between a heap's output and a fresh one. Whether a heap holds a free block that large is the
process's history: T5-small's training step (its embeddings' 62 MiB gradient, AdamW's temporaries
of it) faulted 82 K pages a step in a process of its own, none in one that had run eight other
models before. The price is a process's of its own.

An op's time adds its pages at the calibrated time a page (:class:`~jitflops.estimates.roofline.OpTimes`):
a forward's by this rule, a training step's by the heap's model (:mod:`jitflops.estimates.heap_pages`),
where the heap's own growth and trimming fault in more than the large outputs.
"""

from __future__ import annotations

import math
import mmap

from torch.utils._pytree import tree_leaves

from ...core.records import OpRecord, TensorMeta

FRESH_PAGES_FROM_BYTES = 32 * 2**20
"""glibc's largest dynamic mmap threshold on a 64-bit machine (``DEFAULT_MMAP_THRESHOLD_MAX``)."""

PAGE_BYTES = mmap.PAGESIZE


def fresh_pages(op: OpRecord) -> int:
    """The pages of the op's outputs of at least :data:`FRESH_PAGES_FROM_BYTES` (none for an op in
    place: it writes its target)."""
    if op.kind.endswith("_"):
        return 0
    sizes = (leaf.numel * leaf.dtype.itemsize for leaf in tree_leaves(list(op.outputs))
             if isinstance(leaf, TensorMeta) and leaf.dtype is not None and leaf.shape is not None and all(isinstance(size, int) for size in leaf.shape))
    return sum(math.ceil(size / PAGE_BYTES) for size in sizes if size >= FRESH_PAGES_FROM_BYTES)

