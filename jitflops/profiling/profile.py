"""Profiles of one call: counts (by trace) and latency (a timed eager pass) in one hierarchy.

:func:`profile_model` is the one-call entry point; :mod:`jitflops.deepspeed.flops_profiler` keeps
DeepSpeed's API (``get_model_profile``, ``FlopsProfiler``) on the same pieces.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

from torch import nn

from ..engine.activation_count import ActivationCountAnalysis
from ..engine.communication import communication_of
from ..frontends.dispatch_trace import BackwardFn
from .ranks import profile_on_every_rank
from ..frontends.meta_values import holds_meta
from ..frontends.program_source import ProgramSource, is_program_source
from ..engine.flop_count import FlopCountAnalysis
from .hierarchy import build_hierarchy
from ..engine.jit_analysis import JitModelAnalysis, module_aliases
from ..core.model_io import ModelCall
from .model_profile import ModelProfile, ProfileSummary, profile_convention
from .op_table import op_table
from ..timing.peak_flops import model_peak_flops
from ..core.records import BACKWARD, RECOMPUTE
from ..estimates.byte_count import ByteCountAnalysis
from ..estimates.roofline import DeviceLike, PredictedTimeAnalysis
from ..estimates.devices import DeviceSpec, describes, device_spec
from ..timing.timed_pass import device_name, model_device, time_modules

Progress = Callable[[Iterator[int], int, str], Iterator[int]]


def count_model(model: Union[nn.Module, ProgramSource], call: ModelCall, elementwise: bool = False, backend: str = "jit") -> tuple[FlopCountAnalysis, ActivationCountAnalysis]:
    """FLOPs and activations of one call, from a single trace. Only unsupported ops are warned about.
    A program called with nothing is counted at the sizes it was exported with."""
    sizeless = is_program_source(model) and not call.args and not call.kwargs
    flops = FlopCountAnalysis(model, None if sizeless else call.args, call.kwargs, elementwise=elementwise, backend=backend)
    flops.tracer_warnings("none").uncalled_modules_warnings(False)
    activations = flops.of_same_recording(ActivationCountAnalysis)
    return flops, activations


def predicted_time(subject: Union[nn.Module, ProgramSource], call: ModelCall, flops: FlopCountAnalysis, spec: DeviceSpec, mode: str) -> PredictedTimeAnalysis:
    """The predicted time of the call: from the dispatch backend's recording of the ops eager runs
    (:class:`~jitflops.estimates.roofline.PredictedTimeAnalysis`), the count's own where the count
    is the dispatch backend's or a program's."""
    if flops.counted_by == "dispatch" or not isinstance(subject, nn.Module):
        return flops.of_same_recording(PredictedTimeAnalysis, device=spec, mode=mode)
    return PredictedTimeAnalysis(subject, call.args, call.kwargs, device=spec, mode=mode).unsupported_ops_warnings(False).uncalled_modules_warnings(False)


def training_step_analysis(model: nn.Module, call: ModelCall, backward: Union[bool, BackwardFn] = True) -> FlopCountAnalysis:
    """The forward and backward pass from the model's output, counted by the dispatch backend."""
    analysis = FlopCountAnalysis(model, call.args, call.kwargs, backend="dispatch", backward=backward)
    return analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)


def backward_macs_of(analysis: FlopCountAnalysis) -> tuple[int, int]:
    """MACs of the backward pass, and of the forward activation checkpointing recomputed in it."""
    phases = analysis.by_phase()
    return phases[BACKWARD], phases[RECOMPUTE]


def profile_model(
    model: Union[nn.Module, ProgramSource],
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
    peak_flops: Optional[float] = None,
    progress: Optional[Progress] = None,
    device: Optional[DeviceLike] = None,
    mode: str = "eager",
) -> ModelProfile:
    """Count (by trace) and time (eagerly) ``model`` on one call, into one :class:`ModelProfile`.

    ``repeats`` timed iterations follow ``warm_up`` untimed ones (none with ``timed=False``:
    counts only; a model on the meta device is counted, never timed: it has no values to run on); with ``with_ops`` as many further forwards
    run under ``torch.profiler`` for the per-op table (op times are their medians). ``backend`` picks the counting front end
    (``"jit"`` or ``"dispatch"``, see :class:`~jitflops.JitModelAnalysis`). With ``backward`` (True, or a callable that runs
    the backward from the output), the backward pass's MACs are measured by the dispatch backend
    and reported beside the forward's. ``peak_flops`` (FLOP/s) is what MFU is measured against; by
    default the device's (:mod:`jitflops.timing.peak_flops`: datasheets for GPUs, a GEMM probe on a CPU).
    In a multi-process run every rank profiles its own share, and the profiles are gathered
    (:mod:`jitflops.profiling.ranks`); a rank that fails is named on every rank. Every profile has the
    bytes each module's ops move; with ``device`` (a name of the device table such as ``"h100"``,
    a spec file, a :class:`~jitflops.estimates.devices.DeviceSpec`) it also has the time the roofline predicts
    there, per module (:mod:`jitflops.estimates.roofline`; in execution ``mode``: ``"eager"``, ``"compiled"``
    or, for a GPU's spec, ``"graph"``), beside the measured time where the call was timed.
    ``model`` may be an ``ExportedProgram`` or a ``.pt2`` path: counted from its graph
    (``timed=False``; no inputs: the sizes it was exported with).
    """
    spec = device_spec(device) if device is not None else None
    subject: Union[nn.Module, ProgramSource] = model
    if is_program_source(model):  # an exported program: its graph is counted, nothing runs
        if timed or with_ops or backward:
            raise ValueError("an exported program is counted from its graph, not run: profile it with timed=False, without with_ops or backward")
        from ..frontends.export_trace import module_of, program_of  # sympy: only for a program (program_source.py)

        subject = program_of(model)
        model = module_of(subject)

    def this_rank() -> ModelProfile:
        call = ModelCall.from_user(inputs, kwargs)
        flops, activations = count_model(subject, call, elementwise, backend)
        names = module_aliases(model)
        timed_here = timed and not holds_meta(list(model.parameters()), call)  # a meta model has no values to run on
        timing = time_modules(model, call, names, warm_up=warm_up, repeats=repeats, progress=progress) if timed_here else None
        rows = tuple(op_table(model, call, names, flops.op_counts(), warm_up, repeats, flops.of_same_recording(ByteCountAnalysis).op_counts())) if with_ops else ()
        step = training_step_analysis(model, call, backward) if backward else None
        communication = communication_of(step or flops)  # the backward's collectives too, where it was recorded
        predicted = predicted_time(subject, call, flops, spec, mode).by_module(emit_warnings=False) if spec is not None else None
        measured_on = device_name(model_device(model, call)) if timed_here else None
        predicted_where_timed = spec is not None and measured_on is not None and describes(spec, measured_on)
        root = build_hierarchy(model, flops, activations, timing.modules if timing else None, ignore_modules, communication, predicted, predicted_where_timed)
        backward_macs, recompute_macs = backward_macs_of(step) if step else (None, None)
        summary = ProfileSummary.of(
            root, model, call, model_parallel_size,
            forward=timing.forward if timing else None,
            timing_overhead=timing.overhead if timing else None,
            backward_macs=backward_macs,
            recompute_macs=recompute_macs,
            peak_flops=peak_flops if peak_flops is not None or not timed_here else model_peak_flops(model, call),
            counted_by=flops.counted_by,
            fallback_reason=flops.fallback_reason,
            collectives=tuple(communication.by_collective().values()) if communication else (),
            prediction_device=spec,
            prediction_mode=mode,
            measured_on=measured_on,
            page_faults=timing.page_faults_per_forward if timing else None,
            other_cores=timing.other_cores if timing else None,
        )
        return ModelProfile(root, summary, profile_convention(elementwise), rows, timing.spans if timing else (), None, flops, activations)

    return profile_on_every_rank(this_rank)


def profile_of_analysis(analysis: JitModelAnalysis) -> ModelProfile:
    """An untimed profile of what an analysis counted (FLOPs, or activations), for reports."""
    flops = analysis if isinstance(analysis, FlopCountAnalysis) else None
    activations = analysis if isinstance(analysis, ActivationCountAnalysis) else None
    root = build_hierarchy(analysis._model, flops, activations)
    summary = ProfileSummary.of(root, analysis._model, analysis._call, 1, forward=None, counted_by=analysis.counted_by, fallback_reason=analysis.fallback_reason)
    return ModelProfile(root, summary, profile_convention(bool(flops and flops.counts_elementwise)), (), (), None, flops, activations)
