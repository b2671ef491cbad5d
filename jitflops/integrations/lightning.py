"""FLOPs, FLOP/s and MFU of Lightning training steps.

>>> trainer = pl.Trainer(callbacks=[FlopsCallback()], log_every_n_steps=10)
>>> trainer.fit(module, loader)   # the logger gets flops_per_step, tflops_per_s, mfu and hfu every 10 steps

On a batch that will be logged, the callback counts the module's real training step (its
``training_step`` and the backward from the loss it returns, recorded by the dispatch backend),
once per distinct batch signature, and times the step; other batches are not touched. The figures
go through ``LightningModule.log``, so every configured logger gets them. With a ``schedule``
(``torch.profiler.schedule``), a :class:`~jitflops.FlopsProfiler` also follows the training and
hands each finished profile to ``on_ready``: it profiles the module's forward calls, so
``training_step`` should call ``self(...)``, as Lightning's examples do.
"""

from __future__ import annotations

from typing import Any, Optional

from torch import nn

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package
    import pytorch_lightning as pl  # type: ignore[no-redef]

from ..core.model_io import ModelCall
from .training_step import StepWork, TrainingCallbackBase, loss_backward


class _TrainingStep(nn.Module):
    """A LightningModule's ``training_step`` as a module call, for the dispatch backend."""

    def __init__(self, module: "pl.LightningModule", batch_idx: int) -> None:
        super().__init__()
        self.module = module
        self.batch_idx = batch_idx

    def forward(self, batch: Any) -> Any:
        return self.module.training_step(batch, self.batch_idx)


class FlopsCallback(TrainingCallbackBase, pl.Callback):
    """See :class:`~jitflops.integrations.training_step.TrainingCallbackBase` for the settings."""

    _work: Optional[StepWork] = None
    """The FLOPs of the batch being timed (None: this batch is not logged)."""

    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self.run.start(pl_module)

    @staticmethod
    def _will_log(trainer: "pl.Trainer") -> bool:
        """Whether the batch about to run is logged (Lightning logs every ``log_every_n_steps``)."""
        return (trainer.fit_loop.epoch_loop._batches_that_stepped + 1) % trainer.log_every_n_steps == 0

    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any, batch_idx: int) -> None:
        self._work = None
        if not self._will_log(trainer) or self.run.timer is None:
            return
        self._work = self.run.count(_TrainingStep(pl_module, batch_idx), ModelCall((batch,)), loss_backward)
        self.run.timer.start()

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any, batch_idx: int) -> None:
        self.run.step_done()
        if self._work is None or self.run.timer is None:
            return
        pl_module.log_dict(self.run.metrics(self._work, self.run.timer.stop()), on_step=True, on_epoch=False)

    def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self.run.finish()
