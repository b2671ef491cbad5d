"""The CPU other processes took while a pass was timed: a shared machine's noise, read and named.

A timing is this machine's only where nothing else ran on it. On a 2-core VM, a sweep at work
beside it (a process and its worker, 1.4 cores between them) made a two-layer Llama's decode step
take 6.3 and 15.9 ms against 1.6 alone (the step's parallel kernels wait for torch's second
thread, which waits for a core), and Python's time per instruction 39 to 49 ns against 23.5
(2026-12-07). The figures gave no sign of it.

Read from Linux's ``/proc/stat``: the time every core spent busy (the kernel's and processes',
and the time a VM's host took the core for another guest, ``steal``) less this process's own CPU
time (``getrusage``, its threads included), over the wall time, in cores. The kernel counts in
ticks (``USER_HZ``, a hundredth of a second), so a pass of a tenth of a second reads to a tenth of
a core. None where there is no ``/proc/stat``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import TracebackType
from typing import Optional

try:
    import resource
except ImportError:  # Windows: no getrusage
    resource = None  # type: ignore[assignment]

PROC_STAT = Path("/proc/stat")

BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
"""The fields of ``/proc/stat``'s ``cpu`` line that count a core busy: user, nice, system, irq,
softirq and steal (idle and iowait are not)."""


def _busy_seconds() -> Optional[float]:
    """The seconds every core has been busy since boot (None: no ``/proc/stat``)."""
    try:
        fields = PROC_STAT.read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    return sum(int(fields[index]) for index in BUSY_FIELDS if index < len(fields)) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # type: ignore[union-attr]
    return usage.ru_utime + usage.ru_stime


class OtherLoad:
    """A ``with`` block's reading of the cores other processes kept busy: :attr:`cores` after it
    (None where the OS gives no reading)."""

    def __init__(self) -> None:
        self.cores: Optional[float] = None
        self._start: Optional[tuple[float, float, float]] = None

    def __enter__(self) -> "OtherLoad":
        busy = _busy_seconds()
        self._start = None if busy is None or resource is None else (busy, _own_seconds(), time.perf_counter())
        return self

    def __exit__(self, kind: Optional[type[BaseException]], error: Optional[BaseException], traceback: Optional[TracebackType]) -> None:
        busy = _busy_seconds()
        if self._start is None or busy is None:
            return
        busy_before, own_before, started = self._start
        wall = time.perf_counter() - started
        if wall > 0:
            self.cores = max(0.0, (busy - busy_before) - (_own_seconds() - own_before)) / wall
