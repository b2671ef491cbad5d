"""FLOPs, FLOP/s and MFU of ``transformers.Trainer`` training steps.

>>> trainer = Trainer(model, args, train_dataset=...)
>>> FlopsCallback().attach(trainer)
>>> trainer.train()   # logs carry flops_per_step, tflops_per_s, mfu and hfu at every logging step

On a step that will be logged, the callback times the step and counts its forward and backward
(the dispatch backend, from the model's own loss), once per distinct batch signature; steps that
are not logged are not touched. With a ``schedule`` (``torch.profiler.schedule``), a
:class:`~jitflops.FlopsProfiler` also follows the training and hands each finished profile to
``on_ready``.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, Optional

from torch import nn
from transformers import TrainerCallback

from ..core.model_io import ModelCall
from .training_step import StepWork, TrainingCallbackBase, loss_backward


class FlopsCallback(TrainingCallbackBase, TrainerCallback):
    def __init__(self, *settings: Any, **named: Any) -> None:
        """See :class:`~jitflops.integrations.training_step.TrainingCallbackBase` for the settings."""
        super().__init__(*settings, **named)
        self._model: Optional[nn.Module] = None
        self._hook: Any = None
        self._calls: list[ModelCall] = []
        self._armed = False
        self._counting = False
        self._pending: Optional[dict[str, float]] = None

    def attach(self, trainer: Any) -> "FlopsCallback":
        """Add the callback before the reporting ones, so that they log its figures too."""
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    def _capture(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self._armed and not self._counting and not (self.run.profiler is not None and self.run.profiler.busy):
            self._calls.append(ModelCall(tuple(args), dict(kwargs)).fresh())

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Optional[nn.Module] = None, **kwargs: Any) -> None:
        assert model is not None
        self._model = model
        self._hook = model.register_forward_pre_hook(self._capture, with_kwargs=True)
        self.run.start(model)

    @staticmethod
    def _will_log(args: Any, state: Any) -> bool:
        """Whether the step about to run will be logged, as Trainer's DefaultFlowCallback decides."""
        step = state.global_step + 1
        if str(getattr(args.logging_strategy, "value", args.logging_strategy)) != "steps":
            return False
        return (step == 1 and args.logging_first_step) or (state.logging_steps > 0 and step % state.logging_steps == 0)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._armed = self._will_log(args, state)
        if self._armed and self.run.timer is not None:
            self._calls = []
            self.run.timer.start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.step_done()
        if not self._armed or self.run.timer is None or self._model is None:
            return
        self._armed = False
        seconds = self.run.timer.stop()
        self._counting = True
        try:
            work = functools.reduce(operator.add, (self.run.count(self._model, call, loss_backward) for call in self._calls), StepWork(0))
        finally:
            self._counting = False
        self._pending = self.run.metrics(work, seconds)

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[dict] = None, **kwargs: Any) -> None:
        if self._pending is None or logs is None or "loss" not in logs:
            return
        logs.update(self._pending)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(self._pending)
        self._pending = None

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.run.finish()
