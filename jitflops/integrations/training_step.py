"""What the training callbacks measure: FLOPs of a real training step, its time, FLOP/s, MFU and HFU.

A step's FLOPs are counted, not estimated: the forward and the backward pass are recorded by the
dispatch backend (not "3 x the forward"), once per distinct batch signature, and kept.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional

import torch
from torch import nn

from ..core.records import RECOMPUTE
from ..frontends.dispatch_trace import default_backward
from ..engine.flop_count import FlopCountAnalysis
from ..deepspeed.flops_profiler import FlopsProfiler, Schedule
from ..core.model_io import ModelCall
from ..profiling.model_profile import ModelProfile
from ..timing.peak_flops import peak_flops
from ..timing.timed_pass import Clock, clock_for


@dataclass(frozen=True)
class StepWork:
    """A step's FLOPs (2 x MACs): the model's, its forward and backward (PaLM's model FLOPs, which MFU
    counts), and the forward work its backward ran again (activation checkpointing's forward, the
    scores fused attention kernels recompute), which only HFU counts."""

    model_flops: int
    recomputed_flops: int = 0

    def __add__(self, other: "StepWork") -> "StepWork":
        return StepWork(self.model_flops + other.model_flops, self.recomputed_flops + other.recomputed_flops)


class StepFlops:
    """The :class:`StepWork` of the forward and backward of a model call, counted once per signature."""

    def __init__(self) -> None:
        self._work: dict[Hashable, StepWork] = {}

    def __call__(self, model: nn.Module, call: ModelCall, backward: Callable[[Any], None] = default_backward) -> StepWork:
        key = call.signature()
        if key not in self._work:
            analysis = FlopCountAnalysis(model, call.args, call.kwargs, backend="dispatch", backward=backward)
            phases = analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).by_phase()
            recomputed = phases.get(RECOMPUTE, 0)
            self._work[key] = StepWork(2 * (sum(phases.values()) - recomputed), 2 * recomputed)
        return self._work[key]


def loss_backward(output: Any) -> None:
    """Backward from the model's own loss (``output["loss"]`` or ``output.loss``, as Hugging Face
    models return it), else from the sum of its floating-point outputs."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if isinstance(output, torch.Tensor) and output.dim() == 0:
        loss = output
    if loss is None:
        default_backward(output)
    else:
        loss.backward()


class StepTimer:
    """Seconds of one step, from marks on the step's device (CUDA events on a GPU)."""

    def __init__(self, device: torch.device) -> None:
        self.clock: Clock = clock_for(device)
        self._start: Optional[Any] = None

    def start(self) -> None:
        self._start = self.clock.mark()

    def stop(self) -> Optional[float]:
        if self._start is None:
            return None
        end = self.clock.mark()
        self.clock.synchronize()
        seconds = self.clock.seconds_between(self._start, end)
        self._start = None
        return seconds


def step_metrics(work: StepWork, seconds: float, peak_flops: Optional[float]) -> dict[str, float]:
    """``flops_per_step`` (the model's), ``tflops_per_s`` and, with a peak, ``mfu`` and ``hfu`` (the
    recomputed work too) of one step."""
    metrics = {"flops_per_step": float(work.model_flops), "tflops_per_s": work.model_flops / seconds / 1e12 if seconds > 0 else 0.0}
    if peak_flops:
        metrics["mfu"] = work.model_flops / seconds / peak_flops if seconds > 0 else 0.0
        metrics["hfu"] = (work.model_flops + work.recomputed_flops) / seconds / peak_flops if seconds > 0 else 0.0
    return metrics


class TrainingRun:
    """What a training callback keeps over a run: the step FLOPs counted so far, a timer on the
    model's device, the peak FLOP/s, and, with a ``schedule``, a :class:`~jitflops.FlopsProfiler`
    that follows the training and hands each finished profile to ``on_ready``."""

    def __init__(self, peak_flops: Optional[float], schedule: Optional[Schedule], on_ready: Optional[Callable[[ModelProfile], None]]) -> None:
        self.peak_flops = peak_flops
        self.schedule = schedule
        self.on_ready = on_ready
        self.step_flops = StepFlops()
        self.timer: Optional[StepTimer] = None
        self.profiler: Optional[FlopsProfiler] = None

    def start(self, model: nn.Module) -> None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        dtype = next((p.dtype for p in model.parameters() if p.dtype.is_floating_point), torch.float32)
        self.timer = StepTimer(device)
        if self.peak_flops is None:
            self.peak_flops = peak_flops(device, dtype)
        if self.schedule is not None:
            self.profiler = FlopsProfiler(model, peak_flops=self.peak_flops, schedule=self.schedule, on_ready=self.on_ready).__enter__()

    def count(self, model: nn.Module, call: ModelCall, backward: Callable[[Any], None]) -> StepWork:
        """The step's FLOPs (``step_flops``), with the scheduled profiler looking away."""
        with self.profiler.paused() if self.profiler is not None else contextlib.nullcontext():
            return self.step_flops(model, call, backward)

    def step_done(self) -> None:
        """A training step ended: the scheduled profiler moves on."""
        if self.profiler is not None:
            self.profiler.step()

    def metrics(self, work: StepWork, seconds: Optional[float]) -> dict[str, float]:
        return step_metrics(work, seconds or 0.0, self.peak_flops)

    def finish(self) -> None:
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            self.profiler = None


class TrainingCallbackBase:
    """The settings both training callbacks take (mixed into each framework's callback class)."""

    def __init__(
        self,
        peak_flops: Optional[float] = None,
        schedule: Optional[Schedule] = None,
        on_ready: Optional[Callable[[ModelProfile], None]] = None,
    ) -> None:
        """``peak_flops``: the device's peak FLOP/s (by default from :mod:`jitflops.timing.peak_flops`);
        ``schedule`` (``torch.profiler.schedule(...)``) and ``on_ready``: keep a full profile on
        that schedule, handed to ``on_ready``."""
        self.run = TrainingRun(peak_flops, schedule, on_ready)
