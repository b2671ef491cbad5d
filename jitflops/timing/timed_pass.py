"""The timed eager pass: per-module latency from real forward calls.

Forward pre/post hooks mark the entry and exit of every module call. On a GPU a mark is a CUDA
event recorded on the current stream, and the host synchronises once per iteration, after the
forward, never at module boundaries (which would serialise the GPU and distort what is measured).
On the CPU a mark is a read of the monotonic ``perf_counter_ns`` clock.

Timing costs something: each timed iteration is paired with an iteration without any hooks, and
the two medians give the overhead, measured in the same run.

The iterations without hooks also count the process's minor page faults (``getrusage``, where the
OS keeps the count): pages of memory the forward touched for the first time. A forward that reuses
its allocator's memory faults none. One whose allocator gave freed memory back to the OS faults it
in again every call: glibc trims the top of its heap once the freed memory there passes its
threshold (twice the largest block it has freed), so whether a process does depends on its heap's
history. MobileNetV2 at batch 1 faulted 2,362 to 4,910 pages (9 to 19 MiB) a forward in each
process of its own on a 2-core EPYC, at 0.72 to 0.83 µs a page, and took 19 to 23 ms against 16
with trimming off (``MALLOC_TRIM_THRESHOLD_``), but none in a process holding nine models;
ResNet-50 faulted 4,672 in one process of four, the transformers none. The predicted time leaves
these faults out: it is the time on an allocator that keeps its memory.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

import torch
from torch import nn

from ..core.model_guard import preserved
from ..core.running_module import failures_named, hookable_modules
from ..core.model_io import ModelCall
from ..frontends.meta_values import holds_meta
from .machine_load import OtherLoad

try:
    import resource
except ImportError:  # Windows: no getrusage
    resource = None  # type: ignore[assignment]


@dataclass(frozen=True)
class LatencyStats:
    """Seconds per iteration of one module (summed over its calls in an iteration), over iterations."""

    samples: tuple[float, ...]
    calls_per_iteration: int = 1

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def stdev(self) -> float:
        return statistics.stdev(self.samples) if len(self.samples) > 1 else 0.0

    @property
    def iqr(self) -> float:
        """Interquartile range: the spread that one slow iteration does not inflate."""
        if len(self.samples) < 2:
            return 0.0
        quartiles = statistics.quantiles(self.samples, n=4, method="inclusive")
        return quartiles[2] - quartiles[0]

    @property
    def noisy(self) -> bool:
        """Whether the spread (IQR) is larger than the median: a busy machine, unreliable timings."""
        return self.iqr > self.median

    def as_dict(self) -> dict[str, float]:
        return {
            "median_s": self.median,
            "mean_s": self.mean,
            "min_s": self.min,
            "max_s": self.max,
            "stdev_s": self.stdev,
            "iqr_s": self.iqr,
            "iterations": len(self.samples),
            "calls_per_iteration": self.calls_per_iteration,
        }


@dataclass(frozen=True)
class Span:
    """One module call of the last timed iteration, in seconds from that iteration's start."""

    module: str
    start: float
    end: float
    depth: int


class LatencyCollector:
    """Turns the module calls of successive iterations into per-module :class:`LatencyStats`."""

    def __init__(self) -> None:
        self._samples: dict[str, list[float]] = defaultdict(list)
        self._calls: dict[str, int] = {}
        self.last_spans: tuple[Span, ...] = ()

    def add_iteration(self, calls: list[tuple[str, float, float, int]]) -> None:
        per_module: dict[str, float] = defaultdict(float)
        per_module_calls: dict[str, int] = defaultdict(int)
        for name, start, end, _ in calls:
            per_module[name] += end - start
            per_module_calls[name] += 1
        for name, seconds in per_module.items():
            self._samples[name].append(seconds)
        self._calls.update(per_module_calls)
        self.last_spans = tuple(sorted((Span(*call) for call in calls), key=lambda span: (span.start, span.depth)))

    @property
    def iterations(self) -> int:
        return len(self._samples.get("", ()))

    def stats(self) -> dict[str, LatencyStats]:
        return {name: LatencyStats(tuple(values), self._calls[name]) for name, values in self._samples.items()}


@dataclass(frozen=True)
class TimedPass:
    """Result of :func:`time_modules`: per-module latency, and the forward with and without hooks."""

    modules: dict[str, LatencyStats]
    timed_forward: LatencyStats
    untimed_forward: LatencyStats
    spans: tuple[Span, ...]
    device: str
    warm_up: int
    page_faults: tuple[int, ...] = ()
    """The minor page faults of each iteration without hooks (none counted where the OS keeps no count)."""
    other_cores: Optional[float] = None
    """The cores other processes kept busy while the iterations ran (:mod:`~jitflops.timing.machine_load`;
    None where the OS gives no reading)."""

    @property
    def page_faults_per_forward(self) -> Optional[int]:
        """The median iteration's minor page faults: the pages it touched for the first time (None: not counted)."""
        return int(statistics.median(self.page_faults)) if self.page_faults else None

    @property
    def forward(self) -> LatencyStats:
        return self.modules[""]

    @property
    def overhead(self) -> float:
        """Relative cost of the timing hooks: median forward with hooks / median forward without - 1."""
        return self.timed_forward.median / self.untimed_forward.median - 1.0


class Clock:
    """Marks points in time and measures between them; one kind per device."""

    def mark(self) -> Any:
        raise NotImplementedError

    def seconds_between(self, start: Any, end: Any) -> float:
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait until every mark so far has happened."""


class MonotonicClock(Clock):
    def mark(self) -> int:
        return time.perf_counter_ns()

    def seconds_between(self, start: int, end: int) -> float:
        return (end - start) / 1e9


class CudaEventClock(Clock):
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> "torch.cuda.Event":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds_between(self, start: "torch.cuda.Event", end: "torch.cuda.Event") -> float:
        return start.elapsed_time(end) / 1e3

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


def clock_for(device: torch.device) -> Clock:
    return CudaEventClock(device) if device.type == "cuda" else MonotonicClock()


def device_name(device: torch.device) -> str:
    """A device by the name a spec is matched against: ``"cpu"``, or the GPU's (``torch.cuda.get_device_name``)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def model_device(model: nn.Module, call: ModelCall) -> torch.device:
    """Where the work happens: the device of the first input tensor, else of the first parameter."""
    for tensor in call.tensors():
        return tensor.device
    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


class ModuleCallRecorder:
    """Forward hooks that mark module entry and exit; collects one iteration's marks at a time."""

    def __init__(self, clock: Clock, names: Mapping[nn.Module, str]) -> None:
        self.clock = clock
        self.names = names
        self._open: list[tuple[str, Any]] = []
        self.marks: list[tuple[str, Any, Any, int]] = []

    def install(self, model: nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
        handles = []
        for module, name in hookable_modules(model, self.names):
            handles.append(module.register_forward_pre_hook(self._entering(name)))
            handles.append(module.register_forward_hook(self._leaving, always_call=True))
        return handles

    def _entering(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            self._open.append((name, self.clock.mark()))

        return hook

    def _leaving(self, module: nn.Module, args: Any, output: Any) -> None:
        end = self.clock.mark()
        name, start = self._open.pop()
        self.marks.append((name, start, end, len(self._open)))

    def take_iteration(self) -> list[tuple[str, float, float, int]]:
        """The finished iteration's calls as (module, start, end, depth), seconds from the first mark."""
        self.clock.synchronize()
        marks, self.marks = self.marks, []
        if not marks:
            return []
        origin = min(marks, key=lambda m: m[3])[1]
        return [(name, self.clock.seconds_between(origin, start), self.clock.seconds_between(origin, end), depth) for name, start, end, depth in marks]


def _timed(clock: Clock, run: Callable[[], Any]) -> float:
    start = clock.mark()
    run()
    end = clock.mark()
    clock.synchronize()
    return clock.seconds_between(start, end)


def minor_faults() -> Optional[int]:
    """The minor page faults this process has taken so far (None where the OS keeps no count)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource is not None else None


def faults_since(before: Optional[int]) -> Optional[int]:
    """The minor page faults this process took since :func:`minor_faults` gave ``before`` (None: no count)."""
    after = minor_faults()
    return after - before if before is not None and after is not None else None


def time_modules(
    model: nn.Module,
    call: ModelCall,
    names: Mapping[nn.Module, str],
    warm_up: int = 1,
    repeats: int = 5,
    progress: Optional[Callable[[Iterator[int], int, str], Iterator[int]]] = None,
) -> TimedPass:
    """Time every module of ``model`` over ``repeats`` forward calls after ``warm_up`` untimed ones.

    ``names`` maps each module to its canonical name (the one counts use). ``progress``, if given,
    wraps the iteration ranges (for a progress bar). The model comes back unchanged.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    refuse_meta(model, call, "timing")
    device = model_device(model, call)
    clock = clock_for(device)
    recorder = ModuleCallRecorder(clock, names)
    collector = LatencyCollector()
    iterate = progress or (lambda iterations, total, label: iterations)
    timed: list[float] = []
    untimed: list[float] = []
    faults: list[int] = []
    with preserved(model), torch.no_grad(), failures_named(model, names, "timing"):
        for _ in iterate(iter(range(warm_up)), warm_up, "warm-up"):
            call.run(model)
        clock.synchronize()
        with OtherLoad() as other_load:
            for _ in iterate(iter(range(repeats)), repeats, "timed"):
                before = minor_faults()
                untimed.append(_timed(clock, lambda: call.run(model)))
                faulted = faults_since(before)
                if faulted is not None:
                    faults.append(faulted)
                handles = recorder.install(model)
                try:
                    timed.append(_timed(clock, lambda: call.run(model)))
                finally:
                    for handle in handles:
                        handle.remove()
                collector.add_iteration(recorder.take_iteration())
    return TimedPass(collector.stats(), LatencyStats(tuple(timed)), LatencyStats(tuple(untimed)), collector.last_spans, str(device), warm_up, tuple(faults),
                     other_load.cores)


def refuse_meta(model: nn.Module, call: ModelCall, what: str) -> None:
    """Raise where ``model`` or ``call`` is on the meta device: its ops run there without computing
    anything, in microseconds that are no device's time."""
    if holds_meta(list(model.parameters()), call):
        raise ValueError(f"{what} {type(model).__name__} measures it running, and on the meta device nothing runs: count it, "
                         "or predict its time on a device (device='h100', a spec from 'jitflops calibrate')")


def time_model(model: nn.Module, inputs: Any = (), kwargs: Optional[Mapping[str, Any]] = None, *, warm_up: int = 1, repeats: int = 5) -> TimedPass:
    """Per-module latency of ``model`` called with ``inputs`` (and ``kwargs``), keyed like the counts."""
    from ..engine.counting import module_aliases

    return time_modules(model, ModelCall.from_user(inputs, kwargs), module_aliases(model), warm_up=warm_up, repeats=repeats)
