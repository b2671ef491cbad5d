"""The time ``jitflops calibrate`` may take, shared by the op families it measures, and the timing of one call.

Every family gets a share of one budget (:data:`DEFAULT_BUDGET_S` in all: under a minute on any
machine, whatever its products cost). A family measures its sizes from the smallest up, each a few
times, and stops where its share is spent: a slow machine or dtype gets fewer points on its curves,
never a longer calibration. Each call is timed alone: by the host clock on the CPU (whose op returns
when it is done), by CUDA events around its kernels on a GPU (issued while the GPU waits, so that
the host's issue time is not in them), after a write over a buffer larger than
the caches (a model's weights come from memory, not from a cache the previous call warmed).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable, Optional, Sequence

import torch

from ...estimates.costs.fresh_pages import FRESH_PAGES_FROM_BYTES

DEFAULT_BUDGET_S = 40.0
"""The whole calibration's time: the families' shares add up to it."""

BUDGET_VARIABLE = "JITFLOPS_CALIBRATION_BUDGET_S"
"""The environment variable that sets another default budget (a test suite's shorter one)."""


def budget_seconds(given: Optional[float]) -> float:
    """The calibration's budget: ``given``, else :data:`BUDGET_VARIABLE`'s, else :data:`DEFAULT_BUDGET_S`."""
    if given is not None:
        return given
    text = os.environ.get(BUDGET_VARIABLE)
    if text is None:
        return DEFAULT_BUDGET_S
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{BUDGET_VARIABLE} must be a number of seconds, got {text!r}") from None

REPEATS = 5
"""Timed calls per size, after one untimed: their median is the size's time."""

MOST_PASSES = 9
"""Passes over a family's sizes at most (:func:`interleaved_medians`)."""


class Budget:
    """A share of the calibration's time: ``spent()`` says when it is used up."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._start = time.perf_counter()

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self._start)

    def spent(self) -> bool:
        return self.left() <= 0

    def affords(self, seconds: float) -> bool:
        """Whether a size whose calls take ``seconds`` each can still be timed: an untimed call and
        one timed one must fit in what is left (a slow dtype's large size is not started)."""
        return 2 * seconds <= self.left()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class OnActivations:
    """A call on ``activations``: tensors a model's forward would have just written (the op before
    it wrote its input), which a timer that ``produces`` rewrites in place before each timed call.

    ``fresh_output``: its output is larger than glibc ever serves from the heap (32 MiB), so each
    call maps fresh pages; the timer that produces then runs it once untimed just before, as a
    training step repeated within a second finds the pages its last step freed. Timed a pass
    apart, a VM that hands freed memory back to its host faults each page on the host: a 64 MiB
    copy took 18 ms in one calibration and 35 to 92 ms in others on the 2-core EPYC, and
    T5-small's training step was priced 31% to 77% over its time. Even so they took 21 to 218 ms
    round to round: the elementwise and reduction curves now stop under 32 MiB, and a fresh page
    is priced apart (:mod:`jitflops.estimates.costs.fresh_pages`); the batched products' largest
    cells (48 heads' 512 x 512 scores and more) keep this."""

    def __init__(self, run: Callable[[], object], *activations: torch.Tensor, fresh_output: bool = False) -> None:
        self.run, self.activations, self.fresh_output = run, activations, fresh_output

    def __call__(self) -> object:
        return self.run()


def on_activations(run: Callable[[], object], *activations: torch.Tensor) -> OnActivations:
    """``run`` on ``activations``, called once to see whether its output is a fresh tensor larger
    than glibc serves from the heap (:data:`~jitflops.estimates.costs.fresh_pages.FRESH_PAGES_FROM_BYTES`)."""
    output = run()
    fresh = (isinstance(output, torch.Tensor) and output.untyped_storage().nbytes() > FRESH_PAGES_FROM_BYTES
             and all(output.untyped_storage().data_ptr() != activation.untyped_storage().data_ptr() for activation in activations))
    return OnActivations(run, *activations, fresh_output=fresh)


QUEUED_CYCLES = 500_000
"""GPU clock cycles (0.25 ms at 2 GHz) the GPU waits before a timed call: the host issues the start
event and the call's kernels meanwhile, so that the events time the kernels alone, back to back, as
a model's stream runs them when the host is ahead. Timed from an idle GPU, a call's time was its
host's issue time: on an H200 every elementwise op's calibrated floor was 13-16 us and bfloat16
attention's 130 us, against 1-4 us and 5 us per kernel in a model's forward (``torch.profiler``)."""


class CallTimer:
    """Times one call at a time on ``device``: its caches flushed before each call (``flush``: the
    operands come from memory, as a model's weights do), or the inputs of an :class:`OnActivations`
    call rewritten in place just before (``produce``: in the caches, as the op before it in a
    forward leaves an activation, while its output's memory is not), or the call run ``reruns`` times untimed
    just before (everything it reads in the caches as its own runs leave it), or none.

    On a 2-core AVX-512 EPYC, MobileNetV2's ReLU6s, batch norms and pads take 1.2, 1.4-1.9 and
    1.4 ms a forward in the model (``torch.profiler``). Priced from calls timed after another
    size's call they came to 2.45, 2.42 and 2.39 ms; after an untimed call of the same op (its
    output's memory warm too) to 1.02, 1.91 and 0.58; on inputs rewritten just before to 1.30, 1.91
    and 1.38."""

    def __init__(self, device: torch.device, flush: bool = True, produce: bool = False, reruns: int = 0) -> None:
        self.device = device
        self._flush = torch.empty(256 * 2**20 if device.type == "cuda" else 64 * 2**20, dtype=torch.uint8, device=device) if flush else None
        self._produce = produce
        self.reruns = reruns

    def seconds(self, run: Callable[[], object]) -> float:
        """The time of one ``run()``."""
        if self._flush is not None:
            self._flush.fill_(1)
        if self._produce and isinstance(run, OnActivations):
            if run.fresh_output:
                run()
            for activation in run.activations:
                activation.mul_(1)
            synchronize(self.device)
        if self.reruns:
            for _ in range(self.reruns):
                run()
            synchronize(self.device)
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(QUEUED_CYCLES)
            start.record()
            run()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        started = time.perf_counter()
        run()
        return time.perf_counter() - started

    def median(self, run: Callable[[], object], repeats: int = REPEATS) -> float:
        """The median time of ``repeats`` calls of ``run`` after an untimed one."""
        run()
        synchronize(self.device)
        return statistics.median(self.seconds(run) for _ in range(repeats))


Maker = Callable[[], Callable[[], object]]
"""Makes a size's operands and gives the call to time: called at the size's first turn, so that
sizes the budget never reaches cost nothing."""


def interleaved_medians(timer: CallTimer, budget: Budget, sizes: Sequence[tuple[float, Maker]]) -> list[Optional[float]]:
    """The median time of each of ``sizes`` ((work, maker) pairs, smallest work first), timed once a
    pass over all of them, round robin, for as many passes as ``budget`` allows (at least one,
    :data:`MOST_PASSES` at most): a stretch of time the machine runs slow falls on every size a
    little, not on a few sizes wholly. A size the rate of the one before it says the budget cannot
    afford is left out (None), with every larger one; the smallest is always timed once."""
    samples: list[list[float]] = [[] for _ in sizes]
    calls: list[Callable[[], object]] = []
    for _ in range(MOST_PASSES):
        for index, (work, make) in enumerate(sizes):
            if index == len(calls):  # its first turn
                before = next(((sizes[previous][0], samples[previous][0]) for previous in range(index - 1, -1, -1) if samples[previous]), None)
                if index and (budget.spent() or (before is not None and not budget.affords((1 + timer.reruns) * work * before[1] / before[0]))):
                    break  # the smallest size is always timed: a family the budget ran short for keeps one point
                calls.append(make())
                calls[index]()  # untimed: allocations, kernel selection
                synchronize(timer.device)
            elif index == 0:  # untimed after the pass before's largest size: a small op right after a large one's free takes 20 times its time once
                calls[0]()
                synchronize(timer.device)
            samples[index].append(timer.seconds(calls[index]))
        if budget.spent():
            break
    return [statistics.median(times) if times else None for times in samples]


def measured_curve(timer: CallTimer, budget: Budget, sizes: Sequence[Any], call_of: Callable[[Any], tuple[float, Maker]],
                   host_s: float = 0.0) -> tuple[tuple[float, float], ...]:
    """A family's curve: ``call_of(size)`` gives each size's work and the maker of its call, timed by
    :func:`interleaved_medians` within ``budget``; ``host_s``, the host's time of an eager call, taken
    off (a CPU's op is timed with its dispatch: the prediction adds that as host time). (work,
    seconds) points in increasing work (sizes of equal work: their median), each at least a nanosecond."""
    made = sorted((call_of(size) for size in sizes), key=lambda pair: pair[0])
    medians = interleaved_medians(timer, budget, made)
    by_work: dict[float, list[float]] = {}
    for (work, _), seconds in zip(made, medians):
        if seconds is not None:
            by_work.setdefault(float(work), []).append(max(seconds - host_s, 1e-9))
    return tuple((work, statistics.median(times)) for work, times in by_work.items())
