"""Profiles: counts and latency in one hierarchy, with a DeepSpeed-style summary.

:func:`profile_model` is the one-call entry point (trace, timed eager pass, optional per-op table).
:func:`get_model_profile` and :class:`FlopsProfiler` keep DeepSpeed's names and signatures: the
first profiles one forward, the second a step of a training loop, with the backward pass and the
optimizer step timed by autograd and optimizer hooks (measured, not estimated).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from .activation_count import ActivationCountAnalysis
from .jit_analysis import module_aliases
from .dispatch_trace import BackwardFn
from .distributed import gather_profile, is_writer
from .errors import JitflopsError
from .file_output import write_text
from .flop_count import FlopCountAnalysis
from .formatting import format_quantity
from .hierarchy import ModuleProfile, build_hierarchy
from .model_io import ModelCall, tensor_leaves
from .op_table import OpRow, op_table
from .timing import Clock, LatencyCollector, LatencyStats, ModuleCallRecorder, Span, clock_for, model_device, time_modules

logger = logging.getLogger(__name__)

Progress = Callable[[Iterator[int], int, str], Iterator[int]]


@dataclass(frozen=True)
class ParallelSizes:
    world: int = 1
    data_parallel: int = 1
    model_parallel: int = 1

    @classmethod
    def current(cls, model_parallel: int = 1) -> "ParallelSizes":
        """From ``torch.distributed`` when it is initialised; a single process otherwise."""
        world = torch.distributed.get_world_size() if torch.distributed.is_available() and torch.distributed.is_initialized() else 1
        return cls(world, max(1, world // model_parallel), model_parallel)


@dataclass(frozen=True)
class ProfileSummary:
    """The figures of DeepSpeed's profile summary. FLOPs are 2 x MACs (+ elementwise flops, if counted)."""

    parallel: ParallelSizes
    batch_size: Optional[int]
    params: int
    macs: int
    flops: int
    forward: Optional[LatencyStats]
    backward: Optional[LatencyStats] = None
    step: Optional[LatencyStats] = None
    timing_overhead: Optional[float] = None
    device: str = "cpu"
    backward_macs: Optional[int] = None
    """MACs of the backward pass, measured by the dispatch backend (None: not measured)."""

    @classmethod
    def of(cls, root: ModuleProfile, model: nn.Module, call: Optional[ModelCall], model_parallel_size: int, **measured: Any) -> "ProfileSummary":
        """The summary of a counted module tree; ``measured`` holds the latencies and backward MACs."""
        return cls(
            parallel=ParallelSizes.current(model_parallel_size),
            batch_size=batch_size_of(call) if call else None,
            params=root.params,
            macs=root.macs,
            flops=root.flops,
            device=str(model_device(model, call)) if call else "cpu",
            **measured,
        )

    @property
    def backward_to_forward(self) -> Optional[float]:
        """The measured backward MACs over the forward's (DeepSpeed assumes 2)."""
        return self.backward_macs / self.macs if self.backward_macs is not None and self.macs else None

    @property
    def iteration_latency(self) -> Optional[float]:
        """Forward + backward + step (medians), as DeepSpeed sums them."""
        parts = [stats.median for stats in (self.forward, self.backward, self.step) if stats is not None]
        return sum(parts) if parts else None

    @property
    def forward_flops_per_second(self) -> Optional[float]:
        return self.flops / self.forward.median if self.forward else None

    @property
    def backward_flops(self) -> int:
        """Measured (2 x backward MACs) when the backward was counted, else DeepSpeed's 2 x fwd FLOPs."""
        return 2 * self.backward_macs if self.backward_macs is not None else 2 * self.flops

    @property
    def backward_flops_per_second(self) -> Optional[float]:
        return self.backward_flops / self.backward.median if self.backward else None

    @property
    def forward_backward_flops_per_second(self) -> Optional[float]:
        if not (self.forward and self.backward):
            return None
        return (self.flops + self.backward_flops) / (self.forward.median + self.backward.median)

    @property
    def samples_per_second(self) -> Optional[float]:
        latency = self.iteration_latency
        return self.batch_size / latency if self.batch_size and latency else None


@dataclass(frozen=True)
class ModelProfile:
    """Everything one profile found: the annotated module tree, the summary, per-op rows and spans."""

    root: ModuleProfile
    summary: ProfileSummary
    convention: str
    op_rows: tuple[OpRow, ...] = ()
    spans: tuple[Span, ...] = ()
    step: Optional[int] = None
    flop_analysis: Optional[FlopCountAnalysis] = None
    activation_analysis: Optional[ActivationCountAnalysis] = None
    ranks: tuple[dict[str, Any], ...] = ()
    """In a multi-process run: each rank's own profile, as its JSON document (see ``distributed``)."""


def batch_size_of(call: ModelCall) -> Optional[int]:
    for tensor in call.tensors():
        return int(tensor.shape[0]) if tensor.dim() > 0 else None
    return None


def count_model(model: nn.Module, call: ModelCall, elementwise: bool = False, backend: str = "jit") -> tuple[FlopCountAnalysis, ActivationCountAnalysis]:
    """FLOPs and activations of one call, from a single trace. Only unsupported ops are warned about."""
    flops = FlopCountAnalysis(model, call.args, call.kwargs, elementwise=elementwise, backend=backend)
    flops.tracer_warnings("none").uncalled_modules_warnings(False)
    activations = ActivationCountAnalysis(model, call.args, call.kwargs, backend=backend).share_trace(flops)
    return flops, activations


def measure_backward_macs(model: nn.Module, call: ModelCall, backward: Union[bool, BackwardFn] = True) -> int:
    """MACs of the backward pass from the model's output, counted by the dispatch backend."""
    analysis = FlopCountAnalysis(model, call.args, call.kwargs, backend="dispatch", backward=backward)
    return analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).by_phase()["backward"]


def profile_model(
    model: nn.Module,
    inputs: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    timed: bool = True,
    backend: str = "jit",
    backward: Union[bool, BackwardFn] = False,
    warm_up: int = 1,
    repeats: int = 5,
    with_ops: bool = False,
    elementwise: bool = False,
    ignore_modules: Sequence[type] = (),
    model_parallel_size: int = 1,
    progress: Optional[Progress] = None,
) -> ModelProfile:
    """Count (by trace) and time (eagerly) ``model`` on one call, into one :class:`ModelProfile`.

    ``repeats`` timed iterations follow ``warm_up`` untimed ones (none with ``timed=False``:
    counts only, which also works on the meta device); with ``with_ops`` a further forward runs
    under ``torch.profiler`` for the per-op table. ``backend`` picks the counting front end
    (``"jit"`` or ``"dispatch"``, see :class:`~jitflops.JitModelAnalysis`). With ``backward`` (True, or a callable that runs
    the backward from the output), the backward pass's MACs are measured by the dispatch backend
    and reported beside the forward's.
    """
    call = ModelCall.from_user(inputs, kwargs)
    flops, activations = count_model(model, call, elementwise, backend)
    names = module_aliases(model)
    timing = time_modules(model, call, names, warm_up=warm_up, repeats=repeats, progress=progress) if timed else None
    rows = tuple(op_table(model, call, names, flops.op_counts())) if with_ops else ()
    root = build_hierarchy(model, flops, activations, timing.modules if timing else None, ignore_modules)
    summary = ProfileSummary.of(
        root, model, call, model_parallel_size,
        forward=timing.forward if timing else None,
        timing_overhead=timing.overhead if timing else None,
        backward_macs=measure_backward_macs(model, call, backward) if backward else None,
    )
    return gather_profile(ModelProfile(root, summary, flops.convention(), rows, timing.spans if timing else (), None, flops, activations))


def get_model_profile(
    model: nn.Module,
    input_shape: Optional[tuple[int, ...]] = None,
    args: Sequence[Any] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    print_profile: bool = True,
    detailed: bool = True,
    module_depth: int = -1,
    top_modules: int = 1,
    warm_up: int = 1,
    as_string: bool = True,
    output_file: Optional[str] = None,
    ignore_modules: Optional[Sequence[type]] = None,
    mode: str = "forward",
    repeats: int = 5,
) -> tuple[Any, Any, Any]:
    """DeepSpeed's ``get_model_profile``: returns ``(flops, macs, params)`` of one forward.

    ``input_shape`` makes a random input of that shape on the model's device (the only argument);
    otherwise ``args`` and ``kwargs`` are the call. Prints (or writes to ``output_file``) the
    profile unless ``print_profile`` is False.
    """
    from .deepspeed_report import format_model_profile

    if mode != "forward":
        raise ValueError("get_model_profile profiles the forward; use FlopsProfiler for training steps")
    if input_shape is not None:
        if args or kwargs:
            raise ValueError("give either input_shape or args/kwargs, not both")
        parameter = next(model.parameters(), None)
        args = (torch.randn(*input_shape, device=parameter.device if parameter is not None else "cpu"),)
    profile = profile_model(model, tuple(args), dict(kwargs or {}), warm_up=warm_up, repeats=repeats, ignore_modules=tuple(ignore_modules or ()))
    if print_profile and is_writer():
        text = format_model_profile(profile, module_depth=module_depth, top_modules=top_modules, detailed=detailed)
        if output_file:
            write_text(output_file, text)
        else:
            print(text)
    flops, macs, params = profile.summary.flops, profile.summary.macs, profile.summary.params
    if as_string:
        return format_quantity(flops, "FLOPS"), format_quantity(macs, "MACs"), format_quantity(params)
    return flops, macs, params


class _TrainingStepHooks:
    """Times a training step: module calls, the backward pass and the optimizer step.

    Backward starts when the gradient reaches the forward's output and ends when every parameter's
    gradient is computed (a multi-grad hook); the optimizer step is bracketed by optimizer step
    hooks, kept only for optimizers that update this model's parameters.
    """

    def __init__(self, model: nn.Module, clock: Clock, names: Mapping[nn.Module, str]) -> None:
        self.model = model
        self.clock = clock
        self.recorder = ModuleCallRecorder(clock, names)
        self.modules = LatencyCollector()
        self.backward: list[float] = []
        self.step: list[float] = []
        self.captured_call: Optional[ModelCall] = None
        self.paused = False
        self._handles: list[Any] = []
        self._backward_start: Optional[Any] = None
        self._step_start: Optional[Any] = None
        self._parameters = {id(p) for p in model.parameters()}

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

    def _capture_inputs(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.captured_call is None and not self.paused:
            self.captured_call = ModelCall(tuple(args), dict(kwargs))

    def _forward_done(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.paused:
            self.recorder.marks.clear()
            return
        self.modules.add_iteration(self.recorder.take_iteration())
        outputs = [t for t in tensor_leaves(output) if t.grad_fn is not None]
        parameters = [p for p in self.model.parameters() if p.requires_grad]
        if outputs and parameters:
            self._handles.append(outputs[0].grad_fn.register_prehook(self._backward_begins))
            self._handles.append(torch.autograd.graph.register_multi_grad_hook(parameters, self._backward_ends, mode="all"))

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


class FlopsProfiler:
    """DeepSpeed's training-loop profiler, counting by trace.

    >>> prof = FlopsProfiler(model)
    >>> for step, batch in enumerate(loader):
    ...     if step == profile_step:
    ...         prof.start_profile()
    ...     loss = model(batch).sum(); loss.backward(); optimizer.step()
    ...     if step == profile_step:
    ...         prof.print_model_profile(profile_step=step)
    ...         prof.end_profile()

    Counts come from a trace of the inputs of the first forward after :meth:`start_profile`
    (counting twice does not double them); latencies are medians over the forwards, backward
    passes and optimizer steps seen while profiling.
    """

    def __init__(self, model: nn.Module, ds_engine: Any = None, model_parallel_size: int = 1, measure_backward: bool = True) -> None:
        """``measure_backward``: also count the backward pass's MACs (dispatch backend, backward from
        the sum of the model's outputs) instead of assuming twice the forward."""
        self.model = model
        self.model_parallel_size = model_parallel_size
        self.measure_backward = measure_backward
        self._hooks: Optional[_TrainingStepHooks] = None
        self._counts: Optional[tuple[FlopCountAnalysis, ActivationCountAnalysis, Optional[int]]] = None
        self.ignore_modules: tuple[type, ...] = ()

    @property
    def started(self) -> bool:
        return self._hooks is not None and bool(self._hooks._handles)

    def start_profile(self, ignore_list: Optional[Sequence[type]] = None) -> None:
        """Start timing module calls, backward and optimizer steps; capture the next forward's inputs."""
        self.end_profile()
        self.ignore_modules = tuple(ignore_list or ())
        device = next((p.device for p in self.model.parameters()), torch.device("cpu"))
        self._hooks = _TrainingStepHooks(self.model, clock_for(device), module_aliases(self.model))
        self._hooks.install()

    def stop_profile(self) -> None:
        """Stop timing; what was measured stays available."""
        if self._hooks is not None:
            self._hooks.remove()

    def reset_profile(self) -> None:
        """Forget what was measured and captured; keep profiling if started."""
        if self._hooks is not None:
            started = self.started
            self._hooks.remove()
            self._hooks = _TrainingStepHooks(self.model, self._hooks.clock, self._hooks.recorder.names)
            if started:
                self._hooks.install()
        self._counts = None

    def end_profile(self) -> None:
        """Stop and remove everything of the profiler from the model (its hooks: it adds nothing else;
        what the training steps changed, parameters and batch-norm statistics, stays)."""
        if self._hooks is not None:
            self._hooks.remove()
        self._hooks, self._counts = None, None

    def _analyses(self) -> tuple[FlopCountAnalysis, ActivationCountAnalysis, Optional[int]]:
        """FLOPs, activations and backward MACs of the captured call, counted once."""
        if self._counts is None:
            if self._hooks is None or self._hooks.captured_call is None:
                raise RuntimeError("no forward pass was profiled: call start_profile() and run the model first")
            self._hooks.paused = True  # the trace runs the forward once more: keep it out of the timings
            try:
                call = self._hooks.captured_call
                self._counts = (*count_model(self.model, call), self._count_backward(call))
            finally:
                self._hooks.paused = False
        return self._counts

    def _count_backward(self, call: ModelCall) -> Optional[int]:
        if not self.measure_backward:
            return None
        try:
            return measure_backward_macs(self.model, call)
        except JitflopsError as error:  # e.g. an output that needs no gradient: fall back to DeepSpeed's 2x
            logger.warning("backward MACs not measured (%s); assuming twice the forward", error)
            return None

    def get_total_macs(self, as_string: bool = False) -> Any:
        macs = self.profile().summary.macs
        return format_quantity(macs, "MACs") if as_string else macs

    def get_total_flops(self, as_string: bool = False) -> Any:
        flops = self.profile().summary.flops
        return format_quantity(flops, "FLOPS") if as_string else flops

    def get_total_params(self, as_string: bool = False) -> Any:
        params = sum(p.numel() for p in self.model.parameters())
        return format_quantity(params) if as_string else params

    def get_total_duration(self, as_string: bool = False) -> Any:
        """Median forward latency in seconds."""
        forward = self.profile().summary.forward
        seconds = forward.median if forward else 0.0
        return f"{seconds * 1e3:.2f} ms" if as_string else seconds

    def profile(self, step: Optional[int] = None) -> ModelProfile:
        """Everything measured so far, as a :class:`ModelProfile`."""
        flops, activations, backward_macs = self._analyses()
        hooks = self._hooks
        assert hooks is not None  # _analyses() checked it
        timings = hooks.modules.stats()
        root = build_hierarchy(self.model, flops, activations, timings, self.ignore_modules)
        summary = ProfileSummary.of(
            root, self.model, hooks.captured_call, self.model_parallel_size,
            forward=timings.get(""),
            backward=LatencyStats(tuple(hooks.backward)) if hooks.backward else None,
            step=LatencyStats(tuple(hooks.step)) if hooks.step else None,
            backward_macs=backward_macs,
        )
        return gather_profile(ModelProfile(root, summary, flops.convention(), (), hooks.modules.last_spans, step, flops, activations))

    def print_model_profile(
        self,
        profile_step: int = 1,
        module_depth: int = -1,
        top_modules: int = 1,
        detailed: bool = True,
        output_file: Optional[str] = None,
    ) -> None:
        from .deepspeed_report import format_model_profile

        text = format_model_profile(self.profile(profile_step), module_depth=module_depth, top_modules=top_modules, detailed=detailed)
        if not is_writer():
            return
        if output_file:
            write_text(output_file, text)
        else:
            print(text)

