"""The timing of a training step for :class:`~jitflops.FlopsProfiler`: module calls, the backward
pass and the optimizer step, measured by hooks while the user's loop runs."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Optional

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ..core.model_io import ModelCall, tensor_leaves
from .timed_pass import Clock, LatencyCollector, LatencyStats, ModuleCallRecorder


def _redirected(module: nn.Module) -> bool:
    """Whether this call of ``module`` is another method routed through its ``__call__``: Lightning
    runs ``training_step`` through a DDP or FSDP wrapper by patching the module's ``forward`` for one
    call (``_ForwardRedirection``). The call's arguments are the step's, not the forward's; the
    forward that the step calls in turn is the one to count and time."""
    forward = vars(module).get("forward")
    return forward is not None and getattr(forward, "__qualname__", "").startswith("_ForwardRedirection.")


class TrainingStepHooks:
    """Times a training step: module calls, the backward pass and the optimizer step, and hands
    each forward to the profiler: ``on_call`` as it starts (what it returns is handed to
    ``on_forward`` when the forward has finished).

    Backward starts when the gradient reaches the forward's output and ends when every parameter's
    gradient is computed (a multi-grad hook); the optimizer step is bracketed by optimizer step
    hooks, kept only for optimizers that update this model's parameters.
    """

    def __init__(self, model: nn.Module, clock: Clock, names: Mapping[nn.Module, str], on_call: Callable[[ModelCall], Any], on_forward: Callable[[Any], None]) -> None:
        self.model = model
        self.clock = clock
        self.recorder = ModuleCallRecorder(clock, names)
        self.modules = LatencyCollector()
        self.backward: list[float] = []
        self.step: list[float] = []
        self.paused = False
        self._on_call = on_call
        self._on_forward = on_forward
        self._calls: list[Any] = []
        self._handles: list[Any] = []
        self._backward_start: Optional[Any] = None
        self._step_start: Optional[Any] = None
        self._parameters = {id(p) for p in model.parameters()}

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    def install(self) -> None:
        self._handles = self.recorder.install(self.model)
        self._handles.append(self.model.register_forward_pre_hook(self._capture_inputs, with_kwargs=True, prepend=True))
        self._handles.append(self.model.register_forward_hook(self._forward_done))
        self._handles.append(register_optimizer_step_pre_hook(self._step_begins))
        self._handles.append(register_optimizer_step_post_hook(self._step_ends))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @contextmanager
    def pausing(self) -> Iterator[None]:
        """Runs of the model in here (the profiler's own traces) are neither timed nor counted."""
        paused, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = paused

    def _capture_inputs(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not self.paused:
            self._calls.append(None if _redirected(module) else self._on_call(ModelCall(tuple(args), dict(kwargs))))

    def _forward_done(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.paused or not self._calls:
            self.recorder.marks.clear()
            return
        if self._calls[-1] is None:  # a redirected call: the model's own forward inside it was measured
            self._calls.pop()
            self.recorder.marks.clear()
            return
        self.modules.add_iteration(self.recorder.take_iteration())
        outputs = [t for t in tensor_leaves(output) if t.grad_fn is not None]
        parameters = [p for p in self.model.parameters() if p.requires_grad]
        if outputs and parameters:
            self._handles.append(outputs[0].grad_fn.register_prehook(self._backward_begins))
            self._handles.append(torch.autograd.graph.register_multi_grad_hook(parameters, self._backward_ends, mode="all"))
        started = self._calls.pop()
        with self.pausing():
            self._on_forward(started)

    def _backward_begins(self, grad_outputs: Any) -> None:
        if self._backward_start is None:
            self._backward_start = self.clock.mark()

    def _backward_ends(self, grads: Any) -> None:
        if self._backward_start is not None:
            end = self.clock.mark()
            self.clock.synchronize()
            self.backward.append(self.clock.seconds_between(self._backward_start, end))
            self._backward_start = None

    def _updates_this_model(self, optimizer: torch.optim.Optimizer) -> bool:
        return any(id(p) in self._parameters for group in optimizer.param_groups for p in group["params"])

    def _step_begins(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._updates_this_model(optimizer) and not self.paused:
            self._step_start = self.clock.mark()

    def _step_ends(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._step_start is not None and self._updates_this_model(optimizer):
            end = self.clock.mark()
            self.clock.synchronize()
            self.step.append(self.clock.seconds_between(self._step_start, end))
            self._step_start = None


def total_of(stats: LatencyStats) -> LatencyStats:
    """The time of every forward of a profile together: one sample, DeepSpeed's ``__duration__``."""
    return LatencyStats((sum(stats.samples),), stats.calls_per_iteration)
