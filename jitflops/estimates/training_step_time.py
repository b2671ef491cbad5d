"""The time of a training step, predicted: forward, backward and the optimizer's step, on a device.

The step is recorded on a fake copy of the model (nothing is allocated or computed, the model is
never touched; where its forward reads a value, on a copy with the model's values), in training mode, by the dispatch backend: the forward, then the backward from the
output's ``loss`` (else from the sum of its floating-point outputs), as the memory estimate runs it.
The optimizer's step is recorded on the copy's parameters with gradients, its state made by a
first step: a steady step's ops (AdamW's, per tensor on a CPU, ``foreach`` over lists on a GPU, as
torch's defaults are). Every op is priced as the forward's are (:mod:`jitflops.estimates.roofline`):
its kernel and its host time, a backward op's host time the autograd engine's (no Python), the
optimizer's elementwise ops at least the share of their traffic the caches do not hold at the
memory's bandwidth (:meth:`~.devices.DeviceSpec.for_optimizer_step`), and on a CPU each op's pages
as glibc's heap faults them in, step after step (:mod:`jitflops.estimates.heap_pages`).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Optional

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ..core.errors import TraceError
from ..core.model_io import ModelCall
from ..core.process_groups import is_dtensor
from ..core.records import BACKWARD, FORWARD, RECOMPUTE
from ..engine.counting import module_aliases
from ..frontends.dispatch_trace import BackwardFn, DispatchTrace, loss_backward, record_with_dispatch
from ..frontends.meta_values import DEVICE_META_KERNELS, empty_copy, holds_values, meta_kernels, reads_a_fake_value, valued_copy
from .devices import device_spec, is_cpu_spec
from .heap_pages import heap_pages
from .optimizers import OptimizerChoice, OptimizerFactory, optimizer_factory
from .roofline import WHOLE_CALLS, DeviceLike, predicted_statistics

_PHASES = (BACKWARD, RECOMPUTE)


@dataclass(frozen=True)
class StepTime:
    """A training step's predicted seconds, by part."""

    forward_s: float
    backward_s: float
    """The backward, the forward that activation checkpointing recomputes in it included."""
    optimizer_s: float
    device: str
    mode: str
    pages: Optional[int] = None
    """The pages glibc's heap faults in a steady step, priced in the parts above (a CPU's; None elsewhere)."""

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s


class _OptimizerStep(nn.Module):
    """An optimizer's step as a module's call, for the dispatch backend to record."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        super().__init__()
        self.optimizer = optimizer

    def forward(self) -> None:
        self.optimizer.step()


class OptimizerStepRecording(NamedTuple):
    """An optimizer's steady step, recorded, and the bytes it reads and writes across."""

    trace: DispatchTrace
    touched_bytes: int
    """The parameters', their gradients' and the optimizer's state's bytes: whether the step finds
    them in the caches (:meth:`~.devices.DeviceSpec.for_optimizer_step`)."""
    state_bytes: tuple[int, ...] = ()
    """Each tensor of the optimizer's state, its bytes: the first step makes them, and they stay
    (where the heap puts them, :func:`~.heap_pages.heap_pages`)."""


def record_optimizer_step(parameters: list[nn.Parameter], factory: OptimizerFactory, fake_inputs: bool = False,
                          count_bytecode: bool = False) -> OptimizerStepRecording:
    """A steady step of the optimizer ``factory`` builds (:func:`~.optimizers.optimizer_factory`) on
    ``parameters``, recorded: each is given a zero gradient and the optimizer a first step (its
    state made), and the second step is recorded. DTensor parameters (tensor parallelism's, FSDP2's)
    take their DTensor ops with them (each op's host time is priced), in a parameter group of their
    own beside plain ones (a ``foreach`` op takes one kind, not both). ``count_bytecode``: the
    optimizer's Python between its ops is counted on them (:mod:`~jitflops.frontends.bytecode_count`)."""
    for parameter in parameters:
        parameter.grad = torch.zeros_like(parameter)
    kinds = [[parameter for parameter in parameters if is_dtensor(parameter) == dtensor] for dtensor in (True, False)]
    stepper = _OptimizerStep(factory([{"params": group} for group in kinds] if all(kinds) else parameters))
    stepper()
    trace = record_with_dispatch(stepper, ModelCall((), {}), module_aliases(stepper), fake_inputs=fake_inputs, guarded=False, count_bytecode=count_bytecode,
                                 track_storages=True)
    state = [value for values in stepper.optimizer.state.values() for value in values.values() if isinstance(value, torch.Tensor)]
    gradients = [parameter.grad for parameter in parameters if parameter.grad is not None]
    return OptimizerStepRecording(trace, sum(_bytes(tensor) for tensor in [*parameters, *gradients, *state]), tuple(map(_bytes, state)))


def _bytes(tensor: torch.Tensor) -> int:
    """A tensor's bytes on this rank (a DTensor's local shard's)."""
    local = tensor.to_local() if is_dtensor(tensor) else tensor
    return local.numel() * local.element_size()


def optimizer_dtensor_ops(optimizer: OptimizerChoice = "adamw", foreach: bool = False) -> tuple[int, int]:
    """The DTensor ops a steady step of ``optimizer`` runs over parameters that are DTensors (FSDP2's
    are): (those it runs once, those it runs per tensor), each costing the host DTensor's dispatch.
    Recorded on one and on two tiny DTensor parameters of a one-rank mesh that needs no process
    group: AdamW's per-tensor step (a CPU's) runs 8 per tensor, the moments' and the update's ops
    (its step counters are plain tensors); ``foreach`` runs those 8 once over all of them."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate

    mesh = DeviceMesh("cpu", [0], _init_backend=False, _rank=0)

    def dispatches(tensors: int) -> int:
        parameters = [nn.Parameter(DTensor.from_local(torch.zeros(2, 2), mesh, [Replicate()], run_check=False)) for _ in range(tensors)]
        update = record_optimizer_step(parameters, optimizer_factory(optimizer, foreach=foreach)).trace
        return sum(record.dtensor_ops for _, record in update.records)
    one, two = dispatches(1), dispatches(2)
    return 2 * one - two, two - one


class TrainingStepRecording(NamedTuple):
    """A training step recorded on a fake copy of a model: its forward and backward, its optimizer's steady step."""

    step: DispatchTrace
    update: OptimizerStepRecording
    aliases: Mapping[Any, str]


def record_training_step(model: nn.Module, inputs: Any, kwargs: Optional[Mapping[str, Any]] = None, *, optimizer: OptimizerChoice = "adamw",
                         foreach: bool = False, backward: Optional[BackwardFn] = None, whole_as_on_a_gpu: bool = False) -> TrainingStepRecording:
    """One training step of ``model`` on ``inputs``, recorded on a fake copy (the model is never
    touched): the forward and the backward (``backward``: how to run it from the output; by default
    from its ``loss``, else the sum of its floating outputs), and a steady step of ``optimizer``
    (``foreach``: over lists, as on a GPU). Where the forward reads a value (which fake tensors do
    not have) and the model has values, on a copy with them, computed."""
    call = ModelCall.from_user(inputs, kwargs)
    factory = optimizer_factory(optimizer, foreach=foreach)

    def recorded(values: bool) -> TrainingStepRecording:
        """The step on a copy of the model: of fake tensors, or with ``values`` its values'."""
        with ExitStack() as stack:
            if values:
                twin, twin_call = valued_copy(model, call)
            else:
                fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
                twin, twin_call, _ = empty_copy(model, call, "cpu", fake_mode)
                stack.enter_context(fake_mode)
                stack.enter_context(meta_kernels(DEVICE_META_KERNELS))
            twin.train()
            aliases = module_aliases(twin)
            step = record_with_dispatch(twin, twin_call, aliases, backward or loss_backward, fake_inputs=not values, guarded=False, whole=WHOLE_CALLS,
                                        whole_as_on_a_gpu=whole_as_on_a_gpu, count_bytecode=True, track_storages=True)
            update = record_optimizer_step([parameter for parameter in twin.parameters() if parameter.requires_grad], factory, fake_inputs=not values,
                                           count_bytecode=True)
        return TrainingStepRecording(step, update, aliases)

    try:
        return recorded(values=False)
    except TraceError as error:
        if not (reads_a_fake_value(error.__cause__) and holds_values(model, call)):
            raise
    return recorded(values=True)


def predict_training_step(model: nn.Module, inputs: Any, kwargs: Optional[Mapping[str, Any]] = None, *, device: DeviceLike,
                          optimizer: OptimizerChoice = "adamw", mode: str = "eager", backward: Optional[BackwardFn] = None) -> StepTime:
    """The predicted time of one training step of ``model`` on ``inputs`` on ``device`` (a name of the
    device table, a spec file, a spec): forward, backward (``backward``: how to run it from the
    output; by default from its ``loss``, else the sum of its floating outputs) and a steady step of
    ``optimizer`` (a name the memory estimate knows, an ``Optimizer`` class or a function of the
    parameters)."""
    spec = device_spec(device)
    on_a_gpu = not is_cpu_spec(spec)
    step, update, aliases = record_training_step(model, inputs, kwargs, optimizer=optimizer, foreach=on_a_gpu, backward=backward, whole_as_on_a_gpu=on_a_gpu)
    pages = None if on_a_gpu else heap_pages((step, update.trace), lasting=update.state_bytes)
    by_phase = {FORWARD: 0.0, BACKWARD: 0.0}
    for op, seconds in predicted_statistics(step, spec, mode, aliases, pages=pages).counts[""].items():
        by_phase[BACKWARD if op.partition(".")[0] in _PHASES else FORWARD] += seconds
    optimizer_s = sum(predicted_statistics(update.trace, spec.for_optimizer_step(update.touched_bytes), mode, {}, pages=pages).counts[""].values())
    return StepTime(by_phase[FORWARD], by_phase[BACKWARD], optimizer_s, spec.name, mode, sum(pages.values()) if pages is not None else None)
