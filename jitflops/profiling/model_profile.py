"""What a profile found, as data: the summary figures and the annotated module tree.

Profiles are made by :mod:`jitflops.profiling.profile` and :mod:`jitflops.deepspeed.flops_profiler`, and read by the
reports (:mod:`jitflops.reports.deepspeed_report`, :mod:`jitflops.reports.files`); this module imports neither.

One vocabulary everywhere: ``macs`` are multiply-accumulates (one fused multiply-add is one MAC,
fvcore's "flop"); ``flops`` are ``2 x macs + elementwise_flops``, as DeepSpeed and
``torch.utils.flop_counter`` define them (``elementwise_flops`` is 0 unless elementwise ops were
counted); FLOP/s and MFU are computed from ``flops``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from ..engine.communication import CollectiveTotals
from ..estimates.devices import DeviceSpec, describes
from .generation import GenerationCount
from .hierarchy import ModuleProfile
from ..core.model_io import ModelCall
from .op_table import OpRow
from ..core.process_groups import mesh_model_parallel_size
from ..timing.timed_pass import LatencyStats, Span, model_device

CONVENTION = "macs: multiply-accumulates (1 fused multiply-add = 1 MAC); flops = 2 x macs + elementwise_flops"


def profile_convention(elementwise: bool) -> str:
    """What a profile counted, in one line, for printouts and exports."""
    counted = "counted (1 flop per element)" if elementwise else "not counted (0; elementwise=True counts them)"
    return f"{CONVENTION}; bias adds are not MACs; elementwise_flops of elementwise ops (arithmetic, activations, softmax) {counted}"


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

    @classmethod
    def of_engine(cls, engine: Any) -> "ParallelSizes":
        """From a DeepSpeed engine (or anything with its attributes). Under sequence parallelism
        DeepSpeed reports ``dp_world_size`` as None; the sequence-data-parallel size stands in."""
        data_parallel = getattr(engine, "dp_world_size", None)
        if data_parallel is None:
            data_parallel = getattr(engine, "seq_dp_world_size", None) or 1
        return cls(int(getattr(engine, "world_size", 1) or 1), int(data_parallel), int(getattr(engine, "mp_world_size", 1) or 1))


@dataclass(frozen=True)
class ProfileSummary:
    """The figures of DeepSpeed's profile summary, for the forwards the profile covers.

    ``forwards`` is how many forward calls the counts and latencies cover: 1 for
    :func:`~jitflops.profile_model` (latency is then the median over repeated timed runs), every
    forward between ``start_profile()`` and the printout for a :class:`~jitflops.FlopsProfiler`
    (counts and latencies are then totals over those forwards, as DeepSpeed's are).
    """

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
    recompute_macs: Optional[int] = None
    """MACs of the forward work recomputed in the backward (activation checkpointing's forward, the
    scores fused attention kernels recompute), apart from
    :attr:`backward_macs` (None: the backward was not measured)."""
    forwards: int = 1
    recompute_fwd_factor: float = 0.0
    """DeepSpeed's allowance for activation checkpointing when the backward is not measured."""
    peak_flops: Optional[float] = None
    """The device's peak FLOP/s for the model's dtype (None: unknown); MFU is measured against it."""
    element_bytes: int = 4
    """Bytes per element of the model's floating-point tensors (for arithmetic intensity)."""
    counted_by: str = "jit"
    """The front end that recorded the ops: ``"jit"`` or ``"dispatch"``."""
    fallback_reason: Optional[str] = None
    """Why the dispatch backend counted where the JIT was asked to (None: it did not)."""
    int_macs: int = 0
    """Integer multiply-accumulates (IOPs) of quantized and integer products, apart from :attr:`macs`."""
    masked_out_macs: int = 0
    """Attention MACs the masks discard: in :attr:`macs` (dense), not in the mask-aware count."""
    collectives: tuple[CollectiveTotals, ...] = ()
    """The collectives the profiled calls ran, summed per collective (none in one process)."""
    model_class: str = ""
    """The class of the profiled model (``LlamaForCausalLM``): what a model built from a name turned out to be."""
    bytes: int = 0
    """Bytes the forward's ops read and write (:class:`~jitflops.ByteCountAnalysis`)."""
    predicted_s: Optional[float] = None
    """The forward's time the roofline predicts on :attr:`prediction_device` (None: not asked for)."""
    prediction_device: Optional[DeviceSpec] = None
    prediction_mode: str = "eager"
    """The execution mode :attr:`predicted_s` is for (:data:`~jitflops.estimates.execution.MODES`)."""
    measured_on: Optional[str] = None
    """The device the timed pass ran on, by name: ``"cpu"``, or the GPU's (None: not timed)."""
    page_faults: Optional[int] = None
    """The minor page faults of the median forward without hooks: pages it touched for the first
    time, memory the allocator had given back to the OS (None: not timed, or no count on this OS;
    :mod:`jitflops.timing.timed_pass`). :attr:`predicted_s` leaves their time out."""
    other_cores: Optional[float] = None
    """The cores other processes kept busy while the forward was timed (None: not timed, or no
    reading on this OS; :mod:`jitflops.timing.machine_load`): the latencies are this machine's
    alone only where it is near 0."""

    @property
    def prediction_figure(self) -> str:
        """The figure of :data:`~jitflops.estimates.error_bands.FIGURES` whose measured error :attr:`predicted_s` carries."""
        return "compiled forward" if self.prediction_mode == "compiled" else "forward"

    @property
    def predicted_where_timed(self) -> bool:
        """Whether :attr:`prediction_device` is the device the forward was timed on: only then are
        the two times compared."""
        return self.prediction_device is not None and self.measured_on is not None and describes(self.prediction_device, self.measured_on)

    @property
    def intensity(self) -> Optional[float]:
        """Arithmetic intensity of the forward: FLOPs per byte."""
        return self.flops / self.bytes if self.bytes else None

    @property
    def ridge(self) -> Optional[float]:
        """The prediction device's ridge point for the model's dtype: the intensity (FLOPs per byte)
        above which an op is compute-bound (efficiency x peak / efficiency x bandwidth)."""
        spec = self.prediction_device
        if spec is None:
            return None
        dtype = {8: torch.float64, 2: torch.bfloat16, 1: torch.int8}.get(self.element_bytes, torch.float32)
        return spec.compute_efficiency * spec.peak_for(dtype) / (spec.memory_efficiency * spec.memory_bandwidth)

    @property
    def bound(self) -> Optional[str]:
        """``"compute"`` or ``"memory"``: the forward's intensity against the prediction device's :attr:`ridge`."""
        if self.ridge is None or self.intensity is None:
            return None
        return "compute" if self.intensity >= self.ridge else "memory"  # as ModuleProfile.bound, for the whole forward

    @property
    def unhooked_forward_s(self) -> Optional[float]:
        """The forward's median latency without the timing hooks (:attr:`forward` over one plus
        :attr:`timing_overhead`), the model's own: on a GPU the hooks' CUDA events and Python more
        than doubled small models' forward (an H100, batch 1: +40% to +165%)."""
        if self.forward is None:
            return None
        return self.forward.median / (1 + self.timing_overhead) if self.timing_overhead is not None else self.forward.median

    @property
    def predicted_to_measured(self) -> Optional[float]:
        """The forward's predicted time over its measured one without the timing hooks (None: not
        both, or not of the same device)."""
        measured = self.unhooked_forward_s
        if self.predicted_s is None or measured is None or measured <= 0 or not self.predicted_where_timed:
            return None
        return self.predicted_s / measured

    @property
    def comm_bytes(self) -> int:
        return sum(totals.bytes for totals in self.collectives)

    @property
    def front_end(self) -> str:
        """Which front end counted, in words, for printouts: with the fallback's reason where there was one."""
        words = {"dispatch": "the dispatch backend (ops as they run)", "export": "the export backend (the graph torch.export made)", "jit": "the JIT trace"}
        if self.fallback_reason:
            return f"{words[self.counted_by].partition(' (')[0]}, the JIT's fallback ({self.fallback_reason})"
        return words[self.counted_by]

    @classmethod
    def of(cls, root: ModuleProfile, model: nn.Module, call: Optional[ModelCall], model_parallel_size: int, **measured: Any) -> "ProfileSummary":
        """The summary of a counted module tree; ``measured`` holds the latencies, backward MACs and
        the other fields as keywords. The model-parallel size, unless given, is read from the
        device mesh of the model's DTensor parameters."""
        return cls(
            parallel=measured.pop("parallel", None) or ParallelSizes.current(model_parallel_size if model_parallel_size != 1 else mesh_model_parallel_size(model) or 1),
            batch_size=measured.pop("batch_size", None) or (batch_size_of(call) if call else None),
            params=root.params,
            macs=root.macs,
            flops=root.flops,
            int_macs=root.int_macs,
            masked_out_macs=root.masked_out_macs,
            device=str(model_device(model, call)) if call else "cpu",
            model_class=type(model).__name__,
            bytes=root.bytes,
            predicted_s=root.predicted_s,
            element_bytes=next((p.dtype.itemsize for p in model.parameters() if p.dtype.is_floating_point), 4),
            **measured,
        )

    @property
    def elementwise_flops(self) -> int:
        return self.flops - 2 * self.macs

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
        return self.flops / self.forward.median if self.forward and self.forward.median > 0 else None

    @property
    def backward_factor(self) -> float:
        """Backward FLOPs over forward FLOPs: measured when the backward was counted, else
        DeepSpeed's ``2 + recompute_fwd_factor``."""
        if self.backward_macs is not None and self.macs:
            return self.backward_macs / self.macs
        return 2.0 + self.recompute_fwd_factor

    @property
    def backward_flops(self) -> int:
        """Measured (2 x backward MACs) when the backward was counted, else ``backward_factor`` x fwd FLOPs."""
        return 2 * self.backward_macs if self.backward_macs is not None else round(self.backward_factor * self.flops)

    @property
    def backward_flops_per_second(self) -> Optional[float]:
        return self.backward_flops / self.backward.median if self.backward and self.backward.median > 0 else None

    @property
    def forward_backward_flops_per_second(self) -> Optional[float]:
        if not (self.forward and self.backward):
            return None
        return (self.flops + self.backward_flops) / (self.forward.median + self.backward.median)

    @property
    def iteration_flops_per_second(self) -> Optional[float]:
        latency = self.iteration_latency
        if not (self.forward and self.backward and latency):
            return None
        return (self.flops + self.backward_flops) / latency

    @property
    def samples_per_second(self) -> Optional[float]:
        latency = self.iteration_latency
        return self.batch_size * self.forwards / latency if self.batch_size and latency else None

    @property
    def measured_work(self) -> Optional[tuple[float, float]]:
        """The FLOPs and seconds MFU is measured over: the training step's (forward + backward) when
        the backward was timed, the forward's otherwise (None: not timed)."""
        if self.forward_backward_flops_per_second is not None:
            return self.flops + self.backward_flops, self.forward.median + self.backward.median
        if self.forward_flops_per_second is not None:
            return self.flops, self.forward.median
        return None

    @property
    def masked_out_flops(self) -> int:
        """FLOPs of the attention work the masks discard, within :attr:`measured_work`: the
        forward's and, where the backward is in it, the backward's (its attention products are
        twice the forward's, as they are counted)."""
        forward = 2 * self.masked_out_macs
        return 3 * forward if self.forward_backward_flops_per_second is not None else forward

    @property
    def model_flops(self) -> Optional[float]:
        """The model's FLOPs in :attr:`measured_work` (PaLM's model FLOPs): the work counted, less
        the attention work its masks discard (None: not timed)."""
        work = self.measured_work
        return work[0] - self.masked_out_flops if work is not None else None

    @property
    def mfu(self) -> Optional[float]:
        """Model FLOPs utilisation: the model's FLOP/s (:attr:`model_flops`: masked-out attention
        left out) over the peak. Of the training step (forward + backward) when the backward was
        timed, of the forward otherwise."""
        work = self.measured_work
        return self.model_flops / work[1] / self.peak_flops if work is not None and self.peak_flops else None

    @property
    def recompute_flops(self) -> int:
        """FLOPs of the forward activation checkpointing ran again in the timed backward (0: none
        measured, or the backward was not timed)."""
        return 2 * self.recompute_macs if self.recompute_macs and self.backward is not None else 0

    @property
    def hfu(self) -> Optional[float]:
        """Hardware FLOPs utilisation (the PaLM paper's): the FLOPs the hardware ran (the dense
        count: masked-out attention included) and the recomputed forward, over the same time and
        peak as :attr:`mfu`, which counts the model's FLOPs only. Equal to the MFU where nothing
        was recomputed or masked."""
        work = self.measured_work
        if work is None or not self.peak_flops:
            return None
        return (work[0] + self.recompute_flops) / work[1] / self.peak_flops


@dataclass(frozen=True)
class ModelProfile:
    """Everything one profile found: the annotated module tree, the summary, per-op rows and spans."""

    root: ModuleProfile
    summary: ProfileSummary
    convention: str
    op_rows: tuple[OpRow, ...] = ()
    spans: tuple[Span, ...] = ()
    step: Optional[int] = None
    flop_analysis: Optional[Any] = None
    """The :class:`~jitflops.FlopCountAnalysis` behind the counts (None in a rank's copy)."""
    activation_analysis: Optional[Any] = None
    ranks: tuple["ModelProfile", ...] = ()
    """In a multi-process run: each rank's own profile (see ``distributed``)."""
    generation: Optional[GenerationCount] = None
    """A ``generate()`` profile's forwards one by one: the prefill and each decode step."""

    @property
    def slowest_rank(self) -> Optional[int]:
        """In a multi-process run: the rank whose measured work took longest (None: not timed, or one process)."""
        seconds = [rank.summary.measured_work for rank in self.ranks]
        if not seconds or None in seconds:
            return None
        return max(range(len(seconds)), key=lambda index: seconds[index][1])

    @property
    def cluster_mfu(self) -> Optional[float]:
        """The whole run's MFU: the ranks' FLOPs summed, over the slowest rank's time times the sum
        of the ranks' peaks (every rank waits for the slowest). One process: :attr:`ProfileSummary.mfu`."""
        if not self.ranks:
            return self.summary.mfu
        slowest = self.slowest_rank
        peaks = [rank.summary.peak_flops for rank in self.ranks]
        if slowest is None or not all(peaks):
            return None
        flops = sum(rank.summary.model_flops for rank in self.ranks)
        return flops / (self.ranks[slowest].summary.measured_work[1] * sum(peaks))

    @property
    def tree_peak_flops(self) -> Optional[float]:
        """The peak FLOP/s the module tree's MFU is measured against: the summary's, or in a gathered
        profile, whose tree sums the ranks' counts, the sum of the ranks' peaks."""
        if not self.ranks:
            return self.summary.peak_flops
        peaks = [rank.summary.peak_flops for rank in self.ranks]
        return sum(peaks) if all(peaks) else None

    def module_mfu(self, name: str) -> Optional[float]:
        """A module's MFU: its achieved FLOP/s over the tree's peak (None: not timed, or no peak)."""
        return self.root.find(name).mfu(self.tree_peak_flops)

    def timing_note(self) -> Optional[str]:
        """How many runs the latencies are the median of, and a warning where their spread is larger
        than the median (a busy machine); None when nothing was timed."""
        forward = self.summary.forward
        if forward is None:
            return None
        note = f"latency: the median of {len(forward.samples)} timed runs (IQR {forward.iqr * 1e3:.3f} ms)"
        if forward.noisy:
            note += "; warning: the spread is larger than the median: the machine is busy and timings are unreliable"
        return note


def batch_size_of(call: ModelCall) -> Optional[int]:
    for tensor in call.tensors():
        return int(tensor.shape[0]) if tensor.dim() > 0 else None
    return None
