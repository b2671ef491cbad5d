"""A training run's plan on N GPUs: per rank, its memory and whether it fits; the step's time, split
into compute, each exposed communication, the pipeline's bubble and the optimizer; FLOP/s per GPU,
MFU and HFU, tokens per second, and the GPU-hours of a token budget.

Composed from parts that are each measured or recorded, not from a template of a transformer:

- each pipeline stage's compute and tensor-parallel collectives per micro-batch, from the recording
  of the model's own blocks sharded ``tp`` ways (:mod:`.stages`), priced on the device spec;
- each collective's time on the tier its group crosses (:mod:`.collective_time`, the interconnect
  table): tensor parallelism inside a node, data parallelism and pipeline sends where their ranks
  sit (Megatron's order: tensor, data, pipeline from the innermost);
- the pipeline: 1F1B runs ``m`` micro-batches in ``(m + p - 1)`` stage times, the interleaved
  schedule over ``v`` chunks fills and drains in ``(p - 1) / v`` of them;
- data parallelism: DDP all-reduces the gradients, ZeRO-1/2 (a distributed optimizer)
  reduce-scatters them and all-gathers the updated parameters, ZeRO-3 (FSDP2) gathers each block's
  parameters for every micro-batch's forward and again for its backward (the root's once: it keeps
  them) and reduce-scatters each unit's gradients, a call per unit (:meth:`Planner._data_parallel`);
  each gradient's bytes are the rank's parameters' (from the memory estimate of the sharded copy).
  The frameworks overlap them with compute: the gradients' reduction with the last micro-batch's
  backward, the parameters' gathering with the first one's forward (ZeRO-3: each micro-batch's);
  only what outlasts that compute is exposed;
- the optimizer's step on the rank's parameters (its share under ZeRO), priced as the training
  step's is (:mod:`jitflops.estimates.training_step_time`);
- activation recomputation: ``full`` runs each block's forward again in its backward and keeps only
  its inputs; ``selective`` recomputes attention's scores, which a fused kernel keeps nowhere: as none.

Model FLOPs are the count's (the forward at one sequence, times three, times the sequences);
hardware FLOPs add what recomputation runs again. MFU and HFU are over the device's dense peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch
from torch import nn

from ..estimates.devices import DeviceSpec, device_spec, is_cpu_spec
from ..estimates.error_bands import error_note
from ..estimates.training_step_time import predict_training_step
from ..handles.collectives import Collective
from .collective_time import Placement, collective_seconds
from .interconnects import Interconnect, interconnect
from .layout import Layout, LayoutError
from .stages import ModelCosts, ModelRecordings, PartCosts


@dataclass(frozen=True)
class StepBreakdown:
    """Seconds of a step on its critical path (the slowest pipeline stage's rank)."""

    compute_s: float
    tensor_parallel_s: float
    pipeline_send_s: float
    bubble_s: float
    data_parallel_s: float
    optimizer_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tensor_parallel_s + self.pipeline_send_s + self.bubble_s + self.data_parallel_s + self.optimizer_s


@dataclass(frozen=True)
class StepCollectives:
    """The collectives of one kind a rank on the critical path runs in a step: over which group
    (tensor parallel, data parallel, pipeline), how many calls and how many bytes in all (each
    call's bytes as :class:`~jitflops.handles.collectives.Collective` counts them: an all-gather's
    gathered output, a reduce-scatter's input)."""

    group: str
    name: str
    group_size: int
    calls: int
    bytes: int


@dataclass(frozen=True)
class TrainingPlan:
    """What a layout of a training run comes to (:func:`plan_training`)."""

    layout: Layout
    device: str
    interconnect: str
    gpus: int
    sequence: int
    global_batch: int
    breakdown: StepBreakdown
    memory_per_gpu_bytes: int
    """The largest stage's rank's peak (its weights, gradients, optimizer state, activations in flight)."""
    memory_bytes: Optional[int]
    model_flops_per_step: float
    hardware_flops_per_step: float
    peak_flops: float
    error: str
    """The plan's measured error, in words (:mod:`jitflops.estimates.error_bands`)."""
    tokens: Optional[float] = None
    notes: tuple[str, ...] = field(default=())
    collectives: tuple[StepCollectives, ...] = field(default=())

    @property
    def step_s(self) -> float:
        return self.breakdown.total_s

    @property
    def fits(self) -> Optional[bool]:
        return None if self.memory_bytes is None else self.memory_per_gpu_bytes <= self.memory_bytes

    @property
    def tokens_per_s(self) -> float:
        return self.global_batch * self.sequence / self.step_s

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.model_flops_per_step / self.step_s / self.gpus / 1e12

    @property
    def hardware_tflops_per_gpu(self) -> float:
        return self.hardware_flops_per_step / self.step_s / self.gpus / 1e12

    @property
    def mfu(self) -> float:
        return self.model_tflops_per_gpu * 1e12 / self.peak_flops

    @property
    def hfu(self) -> float:
        return self.hardware_tflops_per_gpu * 1e12 / self.peak_flops

    @property
    def hours(self) -> Optional[float]:
        """Wall hours of the token budget (None: no budget given)."""
        return None if self.tokens is None else self.tokens / self.tokens_per_s / 3600

    @property
    def gpu_hours(self) -> Optional[float]:
        return None if self.hours is None else self.hours * self.gpus

    def to_dict(self) -> dict[str, Any]:
        breakdown = self.breakdown
        return {
            "layout": self.layout.__dict__, "device": self.device, "interconnect": self.interconnect, "gpus": self.gpus, "sequence": self.sequence,
            "global_batch": self.global_batch, "step_s": self.step_s, "mfu": self.mfu, "hfu": self.hfu, "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu, "tokens_per_s": self.tokens_per_s, "memory_per_gpu_bytes": self.memory_per_gpu_bytes,
            "fits": self.fits, "breakdown": {"compute_s": breakdown.compute_s, "tensor_parallel_s": breakdown.tensor_parallel_s,
                                             "pipeline_send_s": breakdown.pipeline_send_s, "bubble_s": breakdown.bubble_s,
                                             "data_parallel_s": breakdown.data_parallel_s, "optimizer_s": breakdown.optimizer_s},
            "tokens": self.tokens, "hours": self.hours, "gpu_hours": self.gpu_hours, "notes": list(self.notes), "error": self.error,
            "collectives": [each.__dict__ for each in self.collectives],
        }


def _split(layers: int, chunks: int) -> list[tuple[int, int]]:
    """``layers`` blocks into ``chunks`` contiguous ranges, as even as they go (the first ones longer)."""
    size, extra = divmod(layers, chunks)
    bounds, start = [], 0
    for index in range(chunks):
        end = start + size + (index < extra)
        bounds.append((start, end))
        start = end
    return bounds


def _comm_seconds(collectives: tuple[tuple[str, Collective], ...], phase: str, link: Interconnect, placement: Placement) -> float:
    return sum(collective_seconds(collective, link, placement) for each_phase, collective in collectives if (each_phase == "forward") == (phase == "forward"))


def _boundary_bytes(model: nn.Module, micro_batch: int, sequence: int, layout: Layout) -> int:
    """The activation a stage sends the next (and its gradient back): one micro-batch's hidden states."""
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    if hidden is None:
        hidden = next(parameter.shape[-1] for parameter in model.parameters() if parameter.dim() == 2)
    dtype = next((parameter.dtype for parameter in model.parameters() if parameter.is_floating_point()), torch.float32)
    return micro_batch * sequence * hidden * dtype.itemsize // (layout.tp if layout.sequence_parallel else 1)


def _units(costs: ModelCosts, ranges: list[tuple[int, int]], layout: Layout, rank: int) -> list[tuple[float, float, bool]]:
    """What FSDP2 shards apart on pipeline rank ``rank``: each block it holds, and the root (what lies
    outside the blocks, on the first and last stages), as (parameter bytes, gradient bytes, is the root)."""
    chunks = layout.pp * layout.virtual_stages
    units: list[tuple[float, float, bool]] = []
    share = 0.0
    for index in range(rank, chunks, layout.pp):
        first, last = ranges[index]
        units += [(costs.blocks[kind].parameter_bytes, costs.blocks[kind].gradient_bytes, False) for kind in costs.block_order[first:last]]
        share += costs.outside_share(index, chunks)
    if share and costs.outside.parameter_bytes:
        units.append((costs.outside.parameter_bytes * share, costs.outside.gradient_bytes * share, True))
    return units


def _step_collectives(groups: dict[str, list[tuple[Collective, int]]]) -> tuple[StepCollectives, ...]:
    """Each group's collectives of a step, added up by kind (calls, and bytes in all)."""
    totals: dict[tuple[str, str, int], list[int]] = {}
    for group, calls in groups.items():
        for collective, count in calls:
            total = totals.setdefault((group, collective.name, collective.group_size), [0, 0])
            total[0] += count
            total[1] += count * collective.bytes
    return tuple(StepCollectives(group, name, size, calls, size_bytes) for (group, name, size), (calls, size_bytes) in totals.items())


class Planner:
    """Plans of one model on one device and interconnect, its recordings kept across layouts."""

    def __init__(self, model: nn.Module, sequence: int, global_batch: int, device: Union[str, DeviceSpec], link: Union[str, Interconnect],
                 optimizer: str = "adamw", optimizer_seconds_per_parameter: Optional[float] = None) -> None:
        self.model, self.sequence, self.global_batch = model, sequence, global_batch
        self.spec = device_spec(device)
        self.link = interconnect(link) if isinstance(link, str) else link
        # collectives overlap compute on a GPU (NCCL's kernels have SMs and copy engines of their
        # own), not on a CPU, where gloo's threads run on the cores that compute
        self._overlaps = not is_cpu_spec(self.spec)
        self.optimizer = optimizer
        self.recordings = ModelRecordings(model, optimizer)
        self._forward_flops: Optional[float] = None
        self._optimizer_per_parameter = optimizer_seconds_per_parameter

    @property
    def forward_flops_per_sequence(self) -> float:
        if self._forward_flops is None:
            self._forward_flops = self.recordings.forward_flops(self.sequence)
        return self._forward_flops

    def optimizer_seconds_per_parameter(self) -> float:
        """The optimizer's steady step's time per parameter on the device (AdamW's ``foreach`` over
        every tensor reads the parameter, its gradient and two moments and writes three), from the
        cost model, on one large layer's weight."""
        if self._optimizer_per_parameter is None:
            probe = nn.Linear(4096, 4096, bias=False, device="meta")
            step = predict_training_step(probe, torch.zeros(8, 4096, device="meta"), device=self.spec, optimizer=self.optimizer)
            self._optimizer_per_parameter = step.optimizer_s / probe.weight.numel()
        return self._optimizer_per_parameter

    def plan(self, layout: Layout, tokens: Optional[float] = None, tp_overlap: bool = True) -> TrainingPlan:
        """The plan of ``layout``: it must use every GPU of its product and divide the model's layers."""
        if layout.cp > 1 or layout.ep > 1:
            raise LayoutError("context and expert parallelism are not planned yet: give cp=1 and ep=1")
        micro_batches = layout.micro_batches(self.global_batch)
        check_heads_divide(self.model, layout.tp)
        costs = self.recordings.costs(layout.tp, layout.micro_batch, self.sequence, self.spec, sequence_parallel=layout.sequence_parallel)
        chunks = layout.pp * layout.virtual_stages
        if costs.layers % chunks:
            raise LayoutError(f"{costs.layers} layers do not divide into {layout.pp} stages x {layout.virtual_stages} chunks")
        ranges = _split(costs.layers, chunks)
        per_rank = [costs.stage(*ranges[rank], layout.pp, rank) for rank in range(layout.pp)]
        for chunk in range(1, layout.virtual_stages):  # an interleaved rank holds a chunk of each round
            per_rank = [per_rank[rank] + costs.stage(*ranges[chunk * layout.pp + rank], chunks, chunk * layout.pp + rank) for rank in range(layout.pp)]
        gpn = self.link.gpus_per_node
        tp_group = Placement(layout.tp, 1, gpn)
        dp_group = Placement(layout.dp, layout.tp * layout.cp, gpn)
        pp_pair = Placement(2, layout.tp * layout.cp * layout.dp, gpn)
        send = Collective("send", 2, _boundary_bytes(self.model, layout.micro_batch, self.sequence, layout))  # a micro-batch's activations, and their gradient back

        def micro_batch_seconds(part: PartCosts) -> tuple[float, float, float]:
            """(compute, exposed tensor-parallel collectives, its sends) of one micro-batch on a rank."""
            forward_tp, backward_tp = (_comm_seconds(part.collectives, phase, self.link, tp_group) for phase in ("forward", "backward"))
            compute = part.forward_s + part.backward_s
            tp = forward_tp + backward_tp
            if layout.recompute == "full":
                compute, tp = compute + part.forward_s, tp + forward_tp
            exposed = max(0.0, tp - compute) if tp_overlap and self._overlaps else tp
            sends = 2 * collective_seconds(send, self.link, pp_pair)
            return compute, exposed, sends * layout.virtual_stages if layout.pp > 1 else 0.0

        times = [micro_batch_seconds(part) for part in per_rank]
        slowest = max(range(layout.pp), key=lambda rank: sum(times[rank]))
        compute, tp_exposed, sends = times[slowest]
        per_micro_batch = compute + tp_exposed + sends
        bubble = (layout.pp - 1) / layout.virtual_stages * per_micro_batch
        part = per_rank[slowest]
        blocks_per_rank = [sum(end - start for start, end in ranges[rank::layout.pp]) for rank in range(layout.pp)]
        data_parallel, dp_calls = self._data_parallel(layout, part, _units(costs, ranges, layout, slowest), micro_batches, dp_group)
        parameters = part.parameter_bytes / max(self._element_size(), 1)
        optimizer = self.optimizer_seconds_per_parameter() * parameters / (layout.dp if layout.zero >= 1 else 1)
        breakdown = StepBreakdown(micro_batches * compute, micro_batches * tp_exposed, micro_batches * sends, bubble, data_parallel, optimizer)
        tp_calls = [(collective, micro_batches * (1 + (layout.recompute == "full" and phase == "forward"))) for phase, collective in part.collectives]
        pp_calls = [(send, 2 * micro_batches * layout.virtual_stages)] if layout.pp > 1 else []
        largest_block = max(block.activation_bytes for block in costs.blocks)
        transient = self.recordings.transient(layout.tp, layout.micro_batch, self.sequence, fsdp=layout.zero == 3 and layout.dp > 1)
        memory = transient + max(self._memory(layout, rank_part, rank, micro_batches, blocks_per_rank[rank], largest_block) for rank, rank_part in enumerate(per_rank))
        model_flops = 3 * self.forward_flops_per_sequence * self.global_batch
        recomputed = self.forward_flops_per_sequence * self.global_batch if layout.recompute == "full" else 0.0
        notes = ["tensor-parallel collectives overlapped with the layer's compute (only what outlasts it is exposed)"] if tp_overlap and self._overlaps else []
        if not self._overlaps:
            notes.append("a CPU: collectives run on the cores that compute (gloo's threads), so none is overlapped")
        if layout.sequence_parallel:
            notes.append("sequence parallelism: each block keeps 1/tp of the unsharded block's activations, and its norms and residuals run on 1/tp of the sequence")
        return TrainingPlan(layout, self.spec.name, self.link.name, layout.gpus, self.sequence, self.global_batch, breakdown, memory,
                            self.spec.memory_bytes, model_flops, model_flops + recomputed, self.spec.peak_for(self._dtype()),
                            error_note(self.spec, "planned throughput"), tokens, tuple(notes),
                            _step_collectives({"tensor parallel": tp_calls, "data parallel": dp_calls, "pipeline": pp_calls}))

    def _dtype(self) -> torch.dtype:
        return next((parameter.dtype for parameter in self.model.parameters() if parameter.is_floating_point()), torch.float32)

    def _element_size(self) -> int:
        return self._dtype().itemsize

    def _data_parallel(self, layout: Layout, part: PartCosts, units: list[tuple[float, float, bool]], micro_batches: int,
                       group: Placement) -> tuple[float, list[tuple[Collective, int]]]:
        """The data-parallel collectives' exposed time (what outlasts the compute it overlaps), and
        each collective with its calls per step. DDP all-reduces the gradients and ZeRO-1/2 reduce-
        scatters them (with the last micro-batch's backward) and all-gathers the updated parameters
        (with the next step's first forward). FSDP2 (ZeRO-3) runs each of its ``units`` alone in every
        micro-batch: it gathers each unit's parameters for the forward and, but the root's (which it
        keeps after the forward), again for the backward, and reduce-scatters each unit's gradients:
        every call pays the ring's latency."""
        if layout.dp == 1:
            return 0.0, []
        dp = layout.dp
        if layout.zero == 3:
            forward = [Collective("all_gather", dp, int(parameters)) for parameters, _, _ in units]
            backward = ([Collective("all_gather", dp, int(parameters)) for parameters, _, root in units if not root]
                        + [Collective("reduce_scatter", dp, int(gradients)) for _, gradients, _ in units])
            per_step = micro_batches
        elif layout.zero == 0:
            forward, backward, per_step = [], [Collective("all_reduce", dp, part.gradient_bytes)], 1
        else:
            forward, backward, per_step = [Collective("all_gather", dp, part.parameter_bytes)], [Collective("reduce_scatter", dp, part.gradient_bytes)], 1

        def exposed(calls: list[Collective], compute: float) -> float:
            return max(0.0, sum(collective_seconds(collective, self.link, group) for collective in calls) - (compute if self._overlaps else 0.0))
        return per_step * (exposed(forward, part.forward_s) + exposed(backward, part.backward_s)), [(collective, per_step) for collective in forward + backward]

    def _memory(self, layout: Layout, part: PartCosts, rank: int, micro_batches: int, blocks: int, largest_block: int) -> int:
        """A stage's rank's peak, less the step's transient (:meth:`ModelRecordings.transient`, added
        to every stage: the first one's is overstated by the head's logits): its weights, gradients
        and optimizer state (their ZeRO shares), and
        the activations of the micro-batches 1F1B keeps in flight on it (``p - rank``; interleaved: a
        chunk's worth more per round). With full recomputation a micro-batch keeps each block's input
        alone, and the block being recomputed its own activations."""
        dp = layout.dp
        weights = part.parameter_bytes / (dp if layout.zero == 3 else 1)
        gradients = part.gradient_bytes / (dp if layout.zero >= 2 else 1)
        state = part.state_bytes / (dp if layout.zero >= 1 else 1)
        in_flight = min(micro_batches, layout.pp - rank + (layout.pp - 1) * (layout.virtual_stages - 1) // layout.virtual_stages)
        if layout.recompute == "full":
            return int(weights + gradients + state + in_flight * blocks * _boundary_bytes(self.model, layout.micro_batch, self.sequence, layout) + largest_block)
        return int(weights + gradients + state + in_flight * part.activation_bytes)


def key_value_heads(model: nn.Module) -> Optional[int]:
    """The key-value heads tensor parallelism splits (a transformers config's), where the model says."""
    config = getattr(model, "config", None)
    return getattr(config, "num_key_value_heads", None) or getattr(config, "num_attention_heads", None)


def check_heads_divide(model: nn.Module, tp: int) -> None:
    """Refuses ``tp`` where it does not divide the model's key-value heads (which the model's own
    reshape would fail on, deep in its attention)."""
    heads = key_value_heads(model)
    if heads is not None and heads % tp:
        raise LayoutError(f"tp {tp} does not divide the {heads} key-value heads")


def plan_training(model: nn.Module, sequence: int, global_batch: int, device: Union[str, DeviceSpec], gpus: int,
                  interconnect_name: Union[str, Interconnect, None] = None, *, tp: int = 1, pp: int = 1, dp: Optional[int] = None, cp: int = 1,
                  ep: int = 1, zero: int = 1, sequence_parallel: Optional[bool] = None, micro_batch: int = 1, schedule: str = "1f1b", virtual_stages: int = 1,
                  recompute: str = "none", optimizer: str = "adamw", tokens: Optional[float] = None, tp_overlap: bool = True) -> TrainingPlan:
    """The plan of training ``model`` (built on the meta device: nothing is allocated) on ``gpus``
    GPUs of ``device`` over ``interconnect_name`` (default: the device's reference system), with
    sequences of ``sequence`` tokens, ``global_batch`` sequences a step, in the layout given
    (``dp`` by default the GPUs left; sequence parallelism by default wherever tensor parallelism
    is). ``tokens``: a budget, for its hours and GPU-hours."""
    spec = device_spec(device)
    dp = dp if dp is not None else gpus // (tp * pp * cp)
    layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, sequence_parallel=tp > 1 if sequence_parallel is None else sequence_parallel,
                    micro_batch=micro_batch, schedule=schedule, virtual_stages=virtual_stages, recompute=recompute)
    if layout.gpus != gpus:
        raise LayoutError(f"tp {tp} x pp {pp} x dp {dp} is {layout.gpus} GPUs, not the {gpus} given")
    link = interconnect_name if interconnect_name is not None else spec.name
    return Planner(model, sequence, global_batch, spec, link, optimizer).plan(layout, tokens, tp_overlap)

