"""DeepSpeed's training-loop profiler, counting by trace: ``FlopsProfiler`` (``get_model_profile``
is :mod:`jitflops.deepspeed.one_call_profile`; the config section :mod:`jitflops.deepspeed.flops_profiler_config`; the
step's timing :mod:`jitflops.timing.step_timing`).

A DeepSpeed user switches by changing the import. What is kept from DeepSpeed:

* every forward between :meth:`FlopsProfiler.start_profile` and the printout is counted (counts
  and latencies are totals over them, as DeepSpeed's are); each distinct call signature (shapes,
  dtypes, structure) is traced once and counted as often as it ran;
* the per-module figures DeepSpeed users read during a profile: ``module.__flops__``,
  ``__macs__`` (the module's own, without its children's), ``__params__``, ``__duration__``, and
  :func:`get_module_flops`, :func:`get_module_macs`, :func:`get_module_duration`; all removed by
  :meth:`FlopsProfiler.end_profile`;
* ``ds_engine`` (its parallel sizes and micro-batch size), ``recompute_fwd_factor``, the
  ``flops_profiler`` section of a DeepSpeed config (:meth:`FlopsProfiler.from_config`);
* ``get_model_profile`` in eval mode (the model's modes are restored after), ``mode="generate"``,
  ``input_shape`` in the model's dtype and device, ``as_string`` in DeepSpeed's format.

What differs: the backward pass is timed by autograd hooks and its MACs are measured, not assumed
to be twice the forward's; FLOPs are ``2 x MACs`` (+ elementwise flops with ``elementwise=True``).
A schedule in ``torch.profiler``'s terms keeps a profile every N steps of a long job.
"""

from __future__ import annotations

import logging
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator, Mapping, Optional, Sequence, Union

import torch
from torch import nn
from torch.profiler import ProfilerAction

from ..engine.communication import CollectiveTotals, combined_totals, communication_of
from ..reports.deepspeed_report import format_aggregated_profile, format_model_profile
from ..profiling.ranks import is_writer, profile_on_every_rank
from ..core.errors import JitflopsError
from ..reports.file_output import write_text
from .flops_profiler_config import FlopsProfilerConfig
from ..reports.formatting import deepspeed_macs, deepspeed_number, deepspeed_params, deepspeed_seconds
from ..profiling.hierarchy import ModuleProfile, build_hierarchy, combined_trees, remove_module_types
from ..estimates.memory_estimate import MemoryEstimate
from ..engine.counting import module_aliases
from ..core.model_io import ModelCall
from ..core.tied_weights import distinct_parameters
from ..profiling.model_profile import ModelProfile, ParallelSizes, ProfileSummary, profile_convention
from ..timing.peak_flops import model_peak_flops
from ..profiling.profile import backward_macs_of, count_model, training_step_analysis
from ..timing.step_timing import TrainingStepHooks, total_of
from ..timing.timed_pass import LatencyStats, clock_for

logger = logging.getLogger(__name__)

Schedule = Callable[[int], ProfilerAction]
"""``torch.profiler.schedule(...)``: the action for each step number."""

MODULE_ATTRIBUTES = ("__flops__", "__macs__", "__params__", "__duration__")


@dataclass
class _CountedCall:
    """One distinct call signature: its counts (a tree without latency) and how often it ran."""

    call: ModelCall
    tree: ModuleProfile
    fallback_reason: Optional[str] = None
    """Why the dispatch backend counted this call (the JIT cannot trace it); None: the JIT counted it."""
    forwards: int = 0
    backward_macs: Optional[tuple[int, int]] = None
    """MACs of one backward of this call, and of the forward recomputed in it (activation checkpointing)."""
    collectives: Mapping[str, CollectiveTotals] = field(default_factory=dict)
    """The collectives of one forward of this call (and of its backward, once that is measured)."""


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

    Or with a schedule, which starts, prints (``on_ready``) and ends profiles by itself:

    >>> with FlopsProfiler(model, schedule=torch.profiler.schedule(wait=99, warmup=0, active=1), on_ready=keep) as prof:
    ...     for batch in loader:
    ...         train_step(batch); prof.step()

    ``measure_backward``: count the backward pass's MACs (dispatch backend, once per call
    signature, only when a backward pass was seen) instead of assuming ``2 + recompute_fwd_factor``
    times the forward. ``peak_flops``: the device's peak FLOP/s, for MFU (by default from
    :mod:`jitflops.timing.peak_flops`).
    """

    def __init__(
        self,
        model: nn.Module,
        ds_engine: Any = None,
        recompute_fwd_factor: float = 0.0,
        *,
        model_parallel_size: int = 1,
        measure_backward: bool = True,
        elementwise: bool = False,
        peak_flops: Optional[float] = None,
        schedule: Optional[Schedule] = None,
        on_ready: Optional[Callable[[ModelProfile], None]] = None,
    ) -> None:
        self.model = model
        self.ds_engine = ds_engine
        self.recompute_fwd_factor = recompute_fwd_factor
        self.model_parallel_size = model_parallel_size
        self.measure_backward = measure_backward
        self.elementwise = elementwise
        self.peak_flops = peak_flops
        self.schedule = schedule
        self.on_ready = on_ready
        """What takes each finished profile of the schedule; None prints it (``_printout``'s settings)."""
        self._printout: dict[str, Any] = {}
        self.ignore_modules: tuple[type, ...] = ()
        self.started = False
        self.step_num = 0
        self.flops: Optional[int] = None
        self.macs: Optional[int] = None
        self.params: Optional[int] = None
        self._hooks: Optional[TrainingStepHooks] = None
        self._counted: dict[Hashable, _CountedCall] = {}
        self._inclusive: dict[str, tuple[int, int]] = {}  # module -> (MACs, FLOPs) of every forward so far
        self._names = module_aliases(model)

    @classmethod
    def from_config(cls, model: nn.Module, config: Union[Mapping[str, Any], str, os.PathLike], **settings: Any) -> "FlopsProfiler":
        """A profiler set up as DeepSpeed's engine sets one up from its config's ``flops_profiler``
        section: it profiles step ``profile_step`` (0-based, DeepSpeed's ``global_steps``) and prints
        the profile (``module_depth``, ``top_modules``, ``detailed``, ``output_file``). Call
        :meth:`step` after each training step. Disabled (``enabled: false``), it does nothing."""
        section = FlopsProfilerConfig.from_deepspeed(config)
        with warnings.catch_warnings():  # torch warns that a schedule without warm-up may skew its own traces
            warnings.simplefilter("ignore", UserWarning)
            schedule = torch.profiler.schedule(skip_first=section.profile_step, wait=0, warmup=0, active=1, repeat=1) if section.enabled else (lambda step: ProfilerAction.NONE)
        profiler = cls(model, recompute_fwd_factor=section.recompute_fwd_factor, schedule=schedule, **settings)
        profiler._printout = {"module_depth": section.module_depth, "top_modules": section.top_modules, "detailed": section.detailed,
                              "output_file": section.output_file}
        return profiler

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Forwards run in here (another tool counting the model) are not profiled."""
        if self._hooks is None:
            yield
            return
        with self._hooks.pausing():
            yield

    @property
    def busy(self) -> bool:
        """Whether the profiler itself is running the model (to count it): those forwards are not
        the user's."""
        return self._hooks is not None and self._hooks.paused

    # -- the schedule ------------------------------------------------------------------------

    def _action(self, step: int) -> ProfilerAction:
        return self.schedule(step) if self.schedule is not None else ProfilerAction.NONE

    def __enter__(self) -> "FlopsProfiler":
        if self._action(self.step_num) != ProfilerAction.NONE:
            self.start_profile(self.ignore_modules)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.end_profile()

    def step(self) -> None:
        """The training step ``step_num`` is over: act on the schedule (``torch.profiler``'s
        meaning: warm-up steps are profiled and discarded, active steps kept, and the profile is
        handed to ``on_ready`` after the last active step of each cycle)."""
        if self.schedule is None:
            raise RuntimeError("step() follows a schedule: give FlopsProfiler(schedule=torch.profiler.schedule(...))")
        done, upcoming = self._action(self.step_num), self._action(self.step_num + 1)
        if done == ProfilerAction.RECORD_AND_SAVE:
            profile = self.profile(self.step_num)
            if self.on_ready is not None:
                self.on_ready(profile)
            else:
                self._print(profile, **self._printout)
            self.end_profile()
        elif done == ProfilerAction.WARMUP and upcoming in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            self.reset_profile()
        self.step_num += 1
        if upcoming != ProfilerAction.NONE and not self.started:
            self.start_profile(self.ignore_modules)

    # -- DeepSpeed's lifecycle ---------------------------------------------------------------

    def start_profile(self, ignore_list: Optional[Sequence[type]] = None) -> None:
        """Start counting and timing forwards, backward passes and optimizer steps."""
        self.end_profile()
        self.ignore_modules = tuple(ignore_list or ())
        device = next((p.device for p in self.model.parameters()), torch.device("cpu"))
        self._hooks = TrainingStepHooks(self.model, clock_for(device), self._names, self._forward_starts, self._count_forward)
        self._hooks.install()
        self.started = True
        self._write_module_attributes()

    def stop_profile(self) -> None:
        """Stop counting and timing; what was measured stays readable until :meth:`end_profile`."""
        if self._hooks is not None:
            self._hooks.remove()

    def reset_profile(self) -> None:
        """Forget what was measured; keep profiling if started."""
        if self._hooks is not None:
            installed = self._hooks.installed
            self._hooks.remove()
            self._hooks = TrainingStepHooks(self.model, self._hooks.clock, self._names, self._forward_starts, self._count_forward)
            if installed:
                self._hooks.install()
        self._counted, self._inclusive = {}, {}
        if self.started:
            self._write_module_attributes()

    def end_profile(self) -> None:
        """Stop and remove everything of the profiler from the model: its hooks and the
        ``__flops__``-style attributes (what the training steps changed stays)."""
        if self._hooks is not None:
            self._hooks.remove()
        self._hooks, self._counted, self._inclusive = None, {}, {}
        self.started = False
        for module in self.model.modules():
            for attribute in MODULE_ATTRIBUTES:
                module.__dict__.pop(attribute, None)

    # -- counting ----------------------------------------------------------------------------

    def _forward_starts(self, call: ModelCall) -> tuple[Hashable, Optional[ModelCall]]:
        """The call's signature, and a copy of the call to count if the signature is new."""
        key = call.signature()
        return key, None if key in self._counted else call.fresh()

    def _count_forward(self, started: tuple[Hashable, Optional[ModelCall]]) -> None:
        """A forward finished: count its signature once, add it to the running totals."""
        key, call = started
        counted = self._counted.get(key)
        if counted is None:
            assert call is not None  # new at the start of the forward
            counted = self._counted[key] = self._count_call(call)
        counted.forwards += 1
        for node in counted.tree.walk():
            macs, flops = self._inclusive.get(node.name, (0, 0))
            self._inclusive[node.name] = (macs + node.macs, flops + node.flops)
        self._write_module_attributes()

    def _count_call(self, call: ModelCall) -> _CountedCall:
        flops, activations = count_model(self.model, call, self.elementwise)
        communication = communication_of(flops)
        tree = build_hierarchy(self.model, flops, activations, communication=communication)
        return _CountedCall(call, tree, flops.fallback_reason, collectives=communication.by_collective() if communication else {})

    def _latency_totals(self) -> dict[str, LatencyStats]:
        return {name: total_of(stats) for name, stats in self._hooks.modules.stats().items()} if self._hooks else {}

    def _write_module_attributes(self) -> None:
        """DeepSpeed's per-module figures: own MACs and FLOPs (children's not included), all
        parameters below the module, and the time of its calls."""
        durations = self._latency_totals()
        children: dict[str, list[str]] = {name: [] for name in self._names.values()}
        for name in children:
            if name:
                children.setdefault(name.rpartition(".")[0], []).append(name)
        for module, name in self._names.items():
            if not isinstance(module, nn.Module):
                continue
            macs, flops = self._inclusive.get(name, (0, 0))
            for child in children.get(name, ()):
                child_macs, child_flops = self._inclusive.get(child, (0, 0))
                macs, flops = macs - child_macs, flops - child_flops
            module.__dict__.update(
                __flops__=flops,
                __macs__=macs,
                __params__=sum(p.numel() for p in distinct_parameters(module)),
                __duration__=durations[name].median if name in durations else 0.0,
            )

    def _backward_macs(self) -> tuple[Optional[int], Optional[int]]:
        """Backward MACs of the profiled forwards, and those of the forward activation checkpointing
        recomputed in them, measured once per call signature."""
        if not (self.measure_backward and self._hooks and self._hooks.backward):
            return None, None
        backward = recompute = 0
        for counted in self._counted.values():
            if counted.backward_macs is None:
                try:
                    with self._hooks.pausing():
                        step = training_step_analysis(self.model, counted.call)
                        counted.backward_macs = backward_macs_of(step)
                    communication = communication_of(step)
                    counted.collectives = communication.by_collective() if communication else {}
                except JitflopsError as error:  # e.g. an output that needs no gradient
                    logger.warning("backward MACs not measured (%s); assuming %g x the forward's", error, 2 + self.recompute_fwd_factor)
                    return None, None
            backward += counted.backward_macs[0] * counted.forwards
            recompute += counted.backward_macs[1] * counted.forwards
        return backward, recompute

    # -- results -----------------------------------------------------------------------------

    def profile(self, step: Optional[int] = None) -> ModelProfile:
        """Everything measured since :meth:`start_profile`, as a :class:`ModelProfile` (in a
        multi-process run, every rank's gathered: every rank must ask, see :mod:`jitflops.profiling.ranks`)."""
        return profile_on_every_rank(lambda: self._this_rank_profile(step))

    def _this_rank_profile(self, step: Optional[int]) -> ModelProfile:
        counted = list(self._counted.values())
        totals = self._latency_totals()
        if counted:
            root = combined_trees([(c.tree, c.forwards) for c in counted], lambda name, _: totals.get(name))
        else:
            root = build_hierarchy(self.model, None)
        root = remove_module_types(root, self.model, self.ignore_modules)
        hooks = self._hooks
        engine = self.ds_engine
        fallback = next((c.fallback_reason for c in counted if c.fallback_reason), None)
        backward_macs, recompute_macs = self._backward_macs()
        summary = ProfileSummary.of(
            root, self.model, counted[0].call if counted else None, self.model_parallel_size,
            parallel=ParallelSizes.of_engine(engine) if engine is not None else None,
            forward=root.latency,
            backward=LatencyStats((sum(hooks.backward),)) if hooks and hooks.backward else None,
            step=LatencyStats((sum(hooks.step),)) if hooks and hooks.step else None,
            backward_macs=backward_macs,
            recompute_macs=recompute_macs,
            forwards=sum(c.forwards for c in counted),
            recompute_fwd_factor=self.recompute_fwd_factor,
            peak_flops=self.peak_flops if self.peak_flops is not None or not counted else model_peak_flops(self.model, counted[0].call),
            batch_size=engine.train_micro_batch_size_per_gpu() if callable(getattr(engine, "train_micro_batch_size_per_gpu", None)) else None,
            counted_by="dispatch" if fallback is not None else "jit",
            fallback_reason=fallback,
            collectives=combined_totals((c.collectives, c.forwards) for c in counted),
        )
        return ModelProfile(root, summary, profile_convention(self.elementwise), (), hooks.modules.last_spans if hooks else (), step)

    def _running(self, index: int) -> int:
        return self._inclusive.get("", (0, 0))[index]

    def get_total_macs(self, as_string: bool = False) -> Any:
        """MACs of every forward since :meth:`start_profile` (0 before the first)."""
        return deepspeed_macs(self._running(0)) if as_string else self._running(0)

    def get_total_flops(self, as_string: bool = False) -> Any:
        """FLOPs (2 x MACs, + elementwise flops if counted) of every forward since :meth:`start_profile`."""
        return deepspeed_number(self._running(1)) if as_string else self._running(1)

    def get_total_params(self, as_string: bool = False) -> Any:
        params = sum(p.numel() for p in distinct_parameters(self.model))
        return deepspeed_params(params) if as_string else params

    def get_total_duration(self, as_string: bool = False) -> Any:
        """Seconds spent in the model's forwards since :meth:`start_profile`."""
        seconds = self._latency_totals().get("", LatencyStats((0.0,))).median
        return deepspeed_seconds(seconds) if as_string else seconds

    def _print(self, profile: ModelProfile, module_depth: int = -1, top_modules: int = 1, detailed: bool = True, output_file: Optional[str] = None,
               memory: Optional[MemoryEstimate] = None) -> None:
        self.flops, self.macs, self.params = profile.summary.flops, profile.summary.macs, profile.summary.params
        text = format_model_profile(profile, module_depth=module_depth, top_modules=top_modules, detailed=detailed, memory=memory)
        if not is_writer():
            return
        if output_file:
            write_text(output_file, text)
        else:
            print(text)

    def print_model_profile(
        self,
        profile_step: int = 1,
        module_depth: int = -1,
        top_modules: int = 1,
        detailed: bool = True,
        output_file: Optional[str] = None,
        memory: Optional[MemoryEstimate] = None,
    ) -> None:
        """DeepSpeed's printout of the profile; between :meth:`start_profile` and
        :meth:`end_profile` only, as DeepSpeed's. ``memory``: a :func:`jitflops.estimates.memory_footprint`
        of the model, printed with it (its peak in the summary, each module's in the tree)."""
        if not self.started:
            logger.warning("print_model_profile() outside a profile: call it after start_profile() and before end_profile()")
            return
        self._print(self.profile(profile_step), module_depth, top_modules, detailed, output_file, memory)

    def print_model_aggregated_profile(self, module_depth: int = -1, top_modules: int = 1) -> None:
        """The top modules by params, MACs and latency at each depth."""
        if not self.started:
            print("no __flops__ attribute in the model, call this function after start_profile and before end_profile")
            return
        if is_writer():
            print(format_aggregated_profile(self.profile().root, module_depth, top_modules))


def get_module_flops(module: nn.Module) -> int:
    """FLOPs of the module and everything below it, during a profile (DeepSpeed's helper)."""
    return module.__flops__ + sum(get_module_flops(child) for child in module.children())


def get_module_macs(module: nn.Module) -> int:
    """MACs of the module and everything below it, during a profile (DeepSpeed's helper)."""
    return module.__macs__ + sum(get_module_macs(child) for child in module.children())


def get_module_duration(module: nn.Module) -> float:
    """Seconds of the module's calls; a container never called (a ModuleList): its children's."""
    duration = module.__duration__
    return duration if duration else sum(child.__duration__ for child in module.children())


__all__ = [
    "FlopsProfiler",
    "FlopsProfilerConfig",
    "get_module_duration",
    "get_module_flops",
    "get_module_macs",
]
