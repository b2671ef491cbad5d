"""The process's allocator as a model's forwards leave it, before anything is timed."""

from __future__ import annotations

import torch

from ...estimates.costs.fresh_pages import FRESH_PAGES_FROM_BYTES


def steady_allocator() -> None:
    """Put this process's allocator where a model's forwards leave it: every size up to 32 MiB
    served from the heap, none from fresh pages.

    glibc serves an allocation above its mmap threshold (128 KiB at the start) with fresh pages,
    faulted in at its first write and handed back at its free; freeing such a block raises the
    threshold to its size, up to :data:`FRESH_PAGES_FROM_BYTES`. A model's first forward frees its
    activations and so raises it; calibration in a new process had not. There, a depthwise
    convolution of 144 channels at 56 x 56 took 1.9 ms a call, and 0.41 ms once a 32 MiB block had
    been freed, and a 1 x 1 one from 16 to 96 channels at 112 x 112 3.3 ms and 0.32. Allocating
    and freeing one block of just under the maximum does what the model's first forward does.
    Larger tensors are served fresh in both (a training step's 154 MB optimizer temporaries):
    calibration times its curves under that size and a fresh page apart, and the prediction adds
    an op's fresh pages (:mod:`jitflops.estimates.costs.fresh_pages`)."""
    torch.empty(FRESH_PAGES_FROM_BYTES - 2**16, dtype=torch.uint8).fill_(0)
