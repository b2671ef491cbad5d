"""A training run's plan on N GPUs: per rank, its memory and whether it fits; the step's time, split
into compute, each exposed communication, the pipeline's bubble and the optimizer; FLOP/s per GPU,
MFU and HFU, tokens per second, and the GPU-hours of a token budget.

Composed from parts that are each measured or recorded, not from a template of a transformer:

- each pipeline stage's compute and tensor-parallel collectives per micro-batch, from the recording
  of the model's own blocks sharded ``tp`` ways (:mod:`.stages`), priced on the device spec;
- each collective's time on the tier its group crosses (:mod:`.collective_time`, the interconnect
  table): tensor parallelism inside a node, data parallelism and pipeline sends where their ranks
  sit (Megatron's order: tensor, data, pipeline from the innermost);
- the pipeline: 1F1B runs ``m`` micro-batches in ``m`` times of its slowest stage and one of each
  other stage (``(m + p - 1)`` stage times where they are even); the interleaved schedule over ``v``
  chunks fills and drains in ``1 / v`` of each other's;
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

from collections import Counter
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch import nn

from ..core.records import EagerOpRecord, TensorMeta
from ..estimates.costs import kernel_seconds
from ..estimates.devices import DeviceSpec, device_spec, is_cpu_spec
from ..estimates.error_bands import error_note
from ..estimates.training_step_time import optimizer_dtensor_ops
from ..handles.collectives import Collective
from .collective_time import Placement, collective_seconds
from .interconnects import Interconnect, interconnect
from .layout import Layout, LayoutError
from .stages import NOTHING, ModelCosts, ModelRecordings, PartCosts
from .pipeline_order import interleaved_actions
from .step_peak import CopiedStep, extrapolated_peak


@dataclass(frozen=True)
class StepBreakdown:
    """Seconds of a step on its critical path (the slowest pipeline stage's rank)."""

    compute_s: float
    tensor_parallel_s: float
    context_parallel_s: float
    expert_parallel_s: float
    pipeline_send_s: float
    bubble_s: float
    data_parallel_s: float
    optimizer_s: float

    @property
    def total_s(self) -> float:
        return sum(getattr(self, field.name) for field in fields(self))

    def scaled(self, times: int) -> "StepBreakdown":
        return StepBreakdown(*(times * getattr(self, field.name) for field in fields(self)))


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
class StageMemory:
    """A pipeline stage's rank's peak, by what holds it (bytes): its weights, the gradients kept
    all the step (a data-parallel buffer's copy, those accumulated over micro-batches) and the
    optimizer's state, each its ZeRO share; the buffers torch's pipelining receives into; and
    what moves in the step at its peak (activations, gradients as they are made, the logits, a
    prefetched block), with the micro-batches 1F1B keeps in flight beside it."""

    weights: int
    kept_gradients: int
    optimizer_state: int
    receive_buffers: int
    """``torch.distributed.pipelining``'s: a stage makes one buffer per micro-batch for each
    direction it receives in (the previous stage's activations, the next one's gradients) at its
    first step, and keeps them all for every step."""
    step_peak: int

    @property
    def total(self) -> int:
        return self.weights + self.kept_gradients + self.optimizer_state + self.receive_buffers + self.step_peak


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
    memory_per_stage: tuple[StageMemory, ...]
    """Each pipeline stage's rank's peak, first stage first."""
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
    def memory_per_stage_bytes(self) -> tuple[int, ...]:
        return tuple(stage.total for stage in self.memory_per_stage)

    @property
    def memory_per_gpu_bytes(self) -> int:
        """The largest stage's rank's peak: what every GPU must hold."""
        return max(self.memory_per_stage_bytes)

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
            "memory_per_stage_bytes": list(self.memory_per_stage_bytes), "memory_per_stage": [stage.__dict__ for stage in self.memory_per_stage], "fits": self.fits, "breakdown": {each.name: getattr(breakdown, each.name) for each in fields(breakdown)},
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


def _comm_seconds(collectives: Sequence[tuple[str, Collective]], phase: str, link: Interconnect, placement: Placement) -> float:
    return sum((collective_seconds(collective, link, placement) for each_phase, collective in collectives if (each_phase == "forward") == (phase == "forward")), 0.0)


def hidden_state_bytes(model: nn.Module, tokens: int) -> int:
    """The bytes of ``tokens`` tokens' hidden states: what a pipeline stage sends the next."""
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    if hidden is None:
        hidden = next(parameter.shape[-1] for parameter in model.parameters() if parameter.dim() == 2)
    dtype = next((parameter.dtype for parameter in model.parameters() if parameter.is_floating_point()), torch.float32)
    return tokens * hidden * dtype.itemsize


def _boundary_bytes(model: nn.Module, micro_batch: int, sequence: int, layout: Layout) -> int:
    """The activation a stage sends the next (and its gradient back): one micro-batch's hidden states."""
    return hidden_state_bytes(model, micro_batch * sequence) // (layout.tp if layout.sequence_parallel else 1)


def _gradient_copies(buffered: bool, zero: int, accumulated: bool) -> tuple[int, bool]:
    """(the copies of a part's gradients kept all the step, whether each gradient its backward
    makes is added into a kept one and freed at once): data parallelism's buffer holds one
    (``buffered``: DDP's buckets; with ZeRO a distributed optimizer's, into which the backward adds
    them); after the part's first backward (``accumulated``) the parameters' own stay as well, to
    accumulate, unless they go into that buffer."""
    into_buffer = buffered and zero > 0
    return buffered + (accumulated and not into_buffer), accumulated or into_buffer


def _kept_per_micro_batch(part: PartCosts, counts: Counter[int], receiving: bool, copied: CopiedStep, boundary: int, full: bool) -> float:
    """What a micro-batch in flight keeps on a stage's ``part`` (``counts`` blocks of each kind): its
    activations (with full recomputation each block's input alone) and the keys and values of a
    returned cache, as long as its activations; less, where the stage receives its input
    (``receiving``), the input its first block saved: it is the receive buffer (the copy's previous
    block had made it)."""
    outputs = copied.per_block("outputs")
    kept = sum(counts.values()) * boundary if full else part.activation_bytes
    return kept + sum(count * outputs[copied.middle_block(kind)] for kind, count in counts.items()) - receiving * boundary


def _units(costs: ModelCosts, ranges: list[tuple[int, int]], layout: Layout, rank: int) -> list[tuple[float, float, bool]]:
    """What FSDP2 shards apart on pipeline rank ``rank``: each block it holds, and the root (what lies
    outside the blocks, on the first and last stages), as (parameter bytes, gradient bytes, is the root)."""
    chunks = layout.pp * layout.virtual_stages
    units: list[tuple[float, float, bool]] = []
    root = NOTHING
    for index in range(rank, chunks, layout.pp):
        first, last = ranges[index]
        units += [(costs.blocks[kind].parameter_bytes, costs.blocks[kind].gradient_bytes, False) for kind in costs.block_order[first:last]]
        root = root + costs.outside_of(index, chunks)
    if root.parameter_bytes:
        units.append((root.parameter_bytes, root.gradient_bytes, True))
    return units


def _sharded(layout: Layout, total: float, experts: float, by_zero: bool) -> float:
    """One rank's share of ``total`` bytes of which ``experts`` are experts': each rank holds 1/ep of
    the experts, and ZeRO (where ``by_zero``) shards the rest over the data- and context-parallel
    ranks, the experts over the ``dp / ep`` ranks that hold the same ones."""
    dense = (total - experts) / (layout.dp * layout.cp if by_zero else 1)
    return dense + experts / layout.ep / (layout.dp // layout.ep if by_zero else 1)


def _context_collectives(part: PartCosts, cp: int) -> list[tuple[str, Collective]]:
    """A micro-batch's context-parallel collectives, each with its phase: each attention call's keys
    and values go round the ring of ``cp`` ranks (an all-gather of every rank's share), and in the
    backward again, with their gradients going back (a reduce-scatter), as Megatron's ring runs them."""
    if cp == 1 or not part.attention_calls:
        return []
    each = cp * part.key_value_bytes // part.attention_calls
    return [("forward", Collective("all_gather", cp, each)), ("backward", Collective("all_gather", cp, each)),
            ("backward", Collective("reduce_scatter", cp, each))] * part.attention_calls


def _expert_collectives(part: PartCosts, ep: int) -> list[tuple[str, Collective]]:
    """A micro-batch's expert-parallel collectives: each mixture-of-experts layer sends its routed rows
    to their experts' ranks and takes their outputs back (two all-to-alls of the rows' bytes), and the
    backward sends their gradients the same two ways."""
    if ep == 1 or not part.expert_calls:
        return []
    each = part.dispatched_bytes // part.expert_calls
    return [(phase, Collective("all_to_all", ep, each)) for phase in ("forward", "forward", "backward", "backward")] * part.expert_calls


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
                 optimizer: str = "adamw") -> None:
        self.model, self.sequence, self.global_batch = model, sequence, global_batch
        self.spec = device_spec(device)
        self.link = interconnect(link) if isinstance(link, str) else link
        # collectives overlap compute on a GPU (NCCL's kernels have SMs and copy engines of their
        # own), not on a CPU, where gloo's threads run on the cores that compute
        self._overlaps = not is_cpu_spec(self.spec)
        self.optimizer = optimizer
        self.recordings = ModelRecordings(model, optimizer)
        self._forward_flops: Optional[float] = None
        self._dtensor_ops: Optional[tuple[int, int]] = None

    @property
    def forward_flops_per_sequence(self) -> float:
        if self._forward_flops is None:
            self._forward_flops = self.recordings.forward_flops(self.sequence)
        return self._forward_flops

    def optimizer_seconds(self, part: PartCosts, share: float, fsdp: bool, costs: ModelCosts) -> float:
        """The optimizer's steady step on a rank holding ``part`` of the model's ``costs``: its
        recorded kernels on the ``share`` of the parameters the rank steps (ZeRO's); its host time
        (and a GPU's launches), each tensor's on a CPU, where each tensor takes ops of its own, and
        on a GPU one part's, where each ``foreach`` op takes every tensor at once; and under ``fsdp``
        DTensor's dispatch of each of its ops on the tensors FSDP2 made DTensors."""
        foreach = not is_cpu_spec(self.spec)
        if self._dtensor_ops is None:
            self._dtensor_ops = optimizer_dtensor_ops(self.optimizer, foreach=foreach)
        once, per_tensor = self._dtensor_ops
        newly = part.parameter_tensors - part.dtensor_parameters if fsdp else 0
        dispatches = ((0 if part.dtensor_parameters else once) + per_tensor * newly) if newly else 0
        host = max(each.optimizer_host_s for each in (costs.outside, *costs.blocks)) if foreach else part.optimizer_host_s
        return part.optimizer_kernel_s * share + host + dispatches * self.spec.host_seconds("dtensor")

    def plan(self, layout: Layout, tokens: Optional[float] = None, tp_overlap: bool = True) -> TrainingPlan:
        """The plan of ``layout``: it must use every GPU of its product. Layers that do not divide into
        its stages are split as evenly as they go, the first stages one longer (DeepSeek-V3's 61
        over 16 stages: 13 of 4 and 3 of 3); the slowest stage sets the step."""
        micro_batches = layout.micro_batches(self.global_batch)
        check_heads_divide(self.model, layout.tp)
        if self.sequence % layout.cp:
            raise LayoutError(f"cp {layout.cp} does not divide the sequence of {self.sequence} tokens")
        sequence = self.sequence // layout.cp  # each context-parallel rank's share of every sequence
        costs = self.recordings.costs(layout.tp, layout.micro_batch, sequence, self.spec, sequence_parallel=layout.sequence_parallel)
        self._check_splits(layout, costs)
        chunks = layout.pp * layout.virtual_stages
        if costs.layers < chunks:
            raise LayoutError(f"{costs.layers} layers are fewer than {layout.pp} stages x {layout.virtual_stages} chunks")
        ranges = _split(costs.layers, chunks)
        per_rank = [costs.stage(*ranges[rank], chunks, rank) for rank in range(layout.pp)]
        for chunk in range(1, layout.virtual_stages):  # an interleaved rank holds a chunk of each round
            per_rank = [per_rank[rank] + costs.stage(*ranges[chunk * layout.pp + rank], chunks, chunk * layout.pp + rank) for rank in range(layout.pp)]
        gpn = self.link.gpus_per_node
        # Megatron's order of ranks, from the innermost: tensor, context, expert (inside data), data, pipeline
        tp_group, cp_group = Placement(layout.tp, 1, gpn), Placement(layout.cp, layout.tp, gpn)
        ep_group = Placement(layout.ep, layout.tp * layout.cp, gpn)
        pp_pair = Placement(2, layout.tp * layout.cp * layout.dp, gpn)
        send = Collective("send", 2, _boundary_bytes(self.model, layout.micro_batch, sequence, layout))  # a micro-batch's activations, and their gradient back
        recomputed = 1 + (layout.recompute == "full")  # how many times a micro-batch's forward runs

        def micro_batch_seconds(part: PartCosts) -> StepBreakdown:
            """One micro-batch on a rank: its compute, and what its collectives expose (no bubble, no step's parts)."""
            forward_tp, backward_tp = (_comm_seconds(part.collectives, phase, self.link, tp_group) for phase in ("forward", "backward"))
            # a context-parallel rank's queries meet every rank's keys: its attention runs cp times the recorded share
            attention_forward, attention_backward = layout.cp * part.attention_forward_s, layout.cp * part.attention_backward_s
            forward = part.forward_s + attention_forward - part.attention_forward_s
            compute = recomputed * forward + part.backward_s + attention_backward - part.attention_backward_s
            tp = recomputed * forward_tp + backward_tp
            context = [_comm_seconds(_context_collectives(part, layout.cp), phase, self.link, cp_group) for phase in ("forward", "backward")]
            experts = [_comm_seconds(_expert_collectives(part, layout.ep), phase, self.link, ep_group) for phase in ("forward", "backward")]
            if self._overlaps:  # the ring's steps pass the keys and values on while attention runs on those at hand
                context = [max(0.0, context[0] - attention_forward), max(0.0, context[1] - attention_backward)]
            exposed_tp = max(0.0, tp - compute) if tp_overlap and self._overlaps else tp
            sends = 2 * collective_seconds(send, self.link, pp_pair) * layout.virtual_stages if layout.pp > 1 else 0.0
            return StepBreakdown(compute, exposed_tp, recomputed * context[0] + context[1], recomputed * experts[0] + experts[1], sends, 0.0, 0.0, 0.0)

        times = [micro_batch_seconds(part) for part in per_rank]
        slowest = max(range(layout.pp), key=lambda rank: times[rank].total_s)
        step = times[slowest]
        # 1F1B: the slowest stage runs every micro-batch; the first one's forward reaches it through
        # the stages before it, and the last one's backward leaves through them (those after it in
        # its warm-up): each other stage's micro-batch once, the interleaved schedule's 1/v of it
        bubble = sum(times[rank].total_s for rank in range(layout.pp) if rank != slowest) / layout.virtual_stages
        part = per_rank[slowest]
        data_parallel, dp_calls = self._data_parallel(layout, part, _units(costs, ranges, layout, slowest), micro_batches)
        share = _sharded(layout, part.parameter_bytes, part.expert_parameter_bytes, layout.zero >= 1) / max(part.parameter_bytes, 1)
        optimizer = self.optimizer_seconds(part, share, layout.zero == 3 and layout.dp * layout.cp > 1, costs)
        breakdown = replace(step.scaled(micro_batches), bubble_s=bubble, data_parallel_s=data_parallel, optimizer_s=optimizer)

        def per_step(collectives: list[tuple[str, Collective]]) -> list[tuple[Collective, int]]:
            return [(collective, micro_batches * (recomputed if phase == "forward" else 1)) for phase, collective in collectives]
        pp_calls = [(send, 2 * micro_batches * layout.virtual_stages)] if layout.pp > 1 else []
        memory = tuple(self._memory(layout, rank_part, rank, micro_batches, Counter(kind for start, end in ranges[rank::layout.pp] for kind in costs.block_order[start:end]),
                                    sequence, costs) for rank, rank_part in enumerate(per_rank))
        model_flops = 3 * self.forward_flops_per_sequence * self.global_batch
        recomputed_flops = self.forward_flops_per_sequence * self.global_batch if layout.recompute == "full" else 0.0
        return TrainingPlan(layout, self.spec.name, self.link.name, layout.gpus, self.sequence, self.global_batch, breakdown, memory,
                            self.spec.memory_bytes, model_flops, model_flops + recomputed_flops, self.spec.peak_for(self._dtype()),
                            error_note(self.spec, "planned throughput"), tokens, tuple(self._notes(layout, tp_overlap)),
                            _step_collectives({"tensor parallel": per_step(list(part.collectives)), "context parallel": per_step(_context_collectives(part, layout.cp)),
                                               "expert parallel": per_step(_expert_collectives(part, layout.ep)), "data parallel": dp_calls, "pipeline": pp_calls}))

    def _check_splits(self, layout: Layout, costs: ModelCosts) -> None:
        """Refuses context or expert parallelism where the model has nothing for it to split."""
        name = type(self.model).__name__
        if layout.cp > 1 and not any(block.attention_calls for block in costs.blocks):
            raise LayoutError(f"context parallelism splits attention's keys and values, and {name}'s blocks call no scaled_dot_product_attention")
        if layout.ep > 1:
            if not any(block.expert_calls for block in costs.blocks):
                raise LayoutError(f"expert parallelism splits a mixture of experts, and {name} has no experts its expert-parallel plan names (config.base_model_ep_plan)")
            experts = expert_count(self.model)
            if experts is not None and experts % layout.ep:
                raise LayoutError(f"ep {layout.ep} does not divide the {experts} experts of each layer")
            if layout.zero == 3:
                raise LayoutError("expert parallelism is planned with DDP or a distributed optimizer (zero 0, 1 or 2), not FSDP2")

    def _notes(self, layout: Layout, tp_overlap: bool) -> list[str]:
        notes = ["tensor-parallel collectives overlapped with the layer's compute (only what outlasts it is exposed)"] if tp_overlap and self._overlaps else []
        if not self._overlaps:
            notes.append("a CPU: collectives run on the cores that compute (gloo's threads), so none is overlapped")
        if layout.sequence_parallel:
            notes.append("sequence parallelism: each block keeps 1/tp of the unsharded block's activations, and its norms and residuals run on 1/tp of the sequence")
        if layout.cp > 1:
            notes.append(f"context parallelism: each rank holds 1/{layout.cp} of every sequence and its queries meet every key (attention load-balanced "
                         "over the ranks, as Megatron splits a causal mask); the keys and values go round the ring (an all-gather forward, an "
                         "all-gather and a reduce-scatter of their gradients backward)" + (", behind attention's compute" if self._overlaps else ""))
        if layout.ep > 1:
            notes.append(f"expert parallelism: each rank holds 1/{layout.ep} of every layer's experts; the routed rows go to their experts and back "
                         "(two all-to-alls forward, two backward, not overlapped), the routing taken as balanced; the experts' gradients are "
                         f"reduced over the dp/ep = {layout.dp // layout.ep} ranks that hold the same experts")
        return notes

    def _dtype(self) -> torch.dtype:
        return next((parameter.dtype for parameter in self.model.parameters() if parameter.is_floating_point()), torch.float32)

    def _data_parallel(self, layout: Layout, part: PartCosts, units: list[tuple[float, float, bool]], micro_batches: int) -> tuple[float, list[tuple[Collective, int]]]:
        """The data-parallel collectives' exposed time (what outlasts the compute it overlaps), and
        each collective with its calls per step. The dense parameters' replicas are the data- and
        context-parallel ranks, the experts' the ``dp / ep`` ranks that hold the same experts. DDP
        all-reduces the gradients and ZeRO-1/2 reduce-scatter them (with the last micro-batch's
        backward) and all-gather the updated parameters (with the next step's first forward). FSDP2
        (ZeRO-3) runs each of its ``units`` alone in every micro-batch: it gathers each unit's
        parameters for the forward and, but the root's (which it keeps after the forward), again for
        the backward, and reduce-scatters each unit's gradients: every call pays the ring's latency;
        on a CPU its hooks' host time per unit and parameter tensor adds to each micro-batch's. Each
        reduces the gradients in their parameters' layout (DDP's buckets, a distributed optimizer's
        buffers, FSDP2's reduce-scatter input), not as a rank may hold them: torch's
        vocabulary-parallel embedding leaves its whole table's gradient on each tensor-parallel
        rank, which FSDP2 by tensor parallelism on 4 gloo ranks reduce-scatters as its shard."""
        gpn = self.link.gpus_per_node
        units = [(parameters, min(parameters, gradients), root) for parameters, gradients, root in units]  # a frozen parameter's: none
        replicas, expert_replicas = layout.dp * layout.cp, layout.dp // layout.ep
        dense = Placement(replicas, layout.tp, gpn)  # data-parallel ranks are tp x cp apart, context-parallel ones tp: together every tp-th
        expert = Placement(expert_replicas, layout.tp * layout.cp * layout.ep, gpn)
        shares = [(dense, part.parameter_bytes - part.expert_parameter_bytes, part.gradient_bytes - part.expert_gradient_bytes),
                  (expert, part.expert_parameter_bytes / layout.ep, part.expert_gradient_bytes / layout.ep)]
        shares = [(group, parameters, min(parameters, gradients)) for group, parameters, gradients in shares if group.size > 1 and gradients]
        if layout.zero == 3:
            forward = [(Collective("all_gather", replicas, int(parameters)), dense) for parameters, _, _ in units] if replicas > 1 else []
            backward = ([(Collective("all_gather", replicas, int(parameters)), dense) for parameters, _, root in units if not root]
                        + [(Collective("reduce_scatter", replicas, int(gradients)), dense) for _, gradients, _ in units]) if replicas > 1 else []
            per_step = micro_batches
        elif layout.zero == 0:
            forward, backward, per_step = [], [(Collective("all_reduce", group.size, int(gradients)), group) for group, _, gradients in shares], 1
        else:
            forward = [(Collective("all_gather", group.size, int(parameters)), group) for group, parameters, _ in shares]
            backward, per_step = [(Collective("reduce_scatter", group.size, int(gradients)), group) for group, _, gradients in shares], 1
        copies = sum(self._copy_seconds(size) for collective, _ in forward + backward
                     for size in self.data_parallel_copied_bytes(collective, replicas)) if layout.zero in (0, 3) else 0.0
        hooks = 0.0  # FSDP2's, on a CPU's one thread (a GPU's run ahead of its kernels)
        if layout.zero == 3 and replicas > 1 and not self._overlaps:
            hooks = len(units) * self.spec.host_seconds("fsdp_unit") + part.parameter_tensors * self.spec.host_seconds("fsdp_tensor")

        def exposed(calls: list[tuple[Collective, Placement]], compute: float) -> float:
            return max(0.0, sum(collective_seconds(collective, self.link, group) for collective, group in calls) - (compute if self._overlaps else 0.0))
        return per_step * (exposed(forward, part.forward_s) + exposed(backward, part.backward_s) + copies + hooks), [(collective, per_step) for collective, _ in forward + backward]

    def data_parallel_copied_bytes(self, collective: Collective, replicas: int) -> list[float]:
        """The copies torch's DDP and FSDP2 make around one of their collectives on the critical
        path, in bytes. DDP copies each gradient into its bucket before the all-reduce (in the
        autograd hook, on the compute stream). FSDP2 copies an all-gather's parameters out of its
        buffer into each one's own storage (``split_with_sizes_copy``, on the compute stream) and,
        on a CPU, where every copy takes the one thread in turn, the rank's shard in; and the
        gradients into a reduce-scatter's buffer (``chunk_cat``: on a GPU on the reduce-scatter's
        stream, overlapped). Megatron's distributed optimizer (ZeRO-1/2) reduces its contiguous
        buffers in place: none."""
        whole = collective.bytes
        if collective.name == "all_reduce":
            return [whole]
        if collective.name == "all_gather":
            return [whole] + ([] if self._overlaps else [whole / replicas])
        return [] if self._overlaps else [whole]

    def _copy_seconds(self, size: float) -> float:
        """The kernel of a copy of ``size`` bytes of the model's dtype on the device: the spec's curve of copies, else the roofline."""
        dtype = self._dtype()
        tensor = TensorMeta((int(size) // dtype.itemsize,), dtype)
        return kernel_seconds(EagerOpRecord("aten::clone", [tensor], [tensor]), self.spec, 0.0, 2.0 * size)

    def _memory(self, layout: Layout, part: PartCosts, rank: int, micro_batches: int, counts: Counter[int], sequence: int, costs: ModelCosts) -> StageMemory:
        """A stage's rank's peak: its weights and optimizer state (their ZeRO shares, the experts'
        1/ep of them), the step's peak of the rest, lifted from the recorded step of a copy with three
        blocks of each kind to the stage's ``counts`` of them (:mod:`.step_peak`), and the
        activations of the micro-batches 1F1B keeps in flight beyond the one stepping (``p - rank``;
        interleaved: walked in torch's order, :meth:`_interleaved_peak`), and on a stage before the last, the outputs
        it sent until their backward (one more once 1F1B is steady), beside the buffers torch's
        pipelining receives into (one per micro-batch and direction: 1.5% of the first stage's
        peak on 2 gloo ranks, which ``MemTracker`` sees once the step writes them). A stage's
        blocks save the activations they receive where they arrive, in those buffers: a micro-batch,
        in flight or stepping, keeps its received input no second time; at a later backward a stage
        after the first still holds the gradient of its input it sent after the backward before. Under 1F1B the first backward is the
        only one with every micro-batch in flight when there are no more micro-batches than that
        (``m <= p - rank``), and the gradients accumulated over micro-batches are not yet made
        then: the peak is the larger of that backward's and the later ones' (13% of the first of
        4 gloo stages with 4 micro-batches). The gradients
        are the step's to free as its backward makes them (FSDP2's sharded ones too), unless they are kept all the step:
        data parallelism's buffer holds a copy (torch DDP's buckets, beside the parameters' own
        gradients; a distributed optimizer's, into which the backward adds them), and after a first
        micro-batch the gradients stay to accumulate; a gradient added into a kept one is freed at
        once. What the embeddings and the head make (the logits, the loss's gradients) is charged to
        the stages holding them. With full recomputation the copy's blocks checkpoint (the model's
        own switch), and a micro-batch in flight keeps each block's input alone."""
        weights = _sharded(layout, part.parameter_bytes, part.expert_parameter_bytes, layout.zero == 3)
        gradients = _sharded(layout, part.gradient_bytes, part.expert_gradient_bytes, layout.zero >= 2)
        state = _sharded(layout, part.state_bytes, part.expert_state_bytes, layout.zero >= 1)
        buffered = layout.dp * layout.cp > 1 and layout.zero < 3
        full = layout.recompute == "full"
        copied = self.recordings.step_memory(layout.tp, layout.micro_batch, sequence, layout.zero == 3 and layout.dp * layout.cp > 1, full)

        def share(each: PartCosts) -> float:
            return _sharded(layout, each.gradient_bytes, each.expert_gradient_bytes, layout.zero >= 2)
        split = layout.sequence_parallel and layout.tp > 1 and not full
        scales = self.recordings.sequence_split(layout.tp, layout.micro_batch, sequence) if split else [1.0] * len(costs.blocks)
        chunks = layout.pp * layout.virtual_stages
        shares = [share(block) for block in costs.blocks]
        boundary = _boundary_bytes(self.model, layout.micro_batch, sequence, layout)

        def peak_of(stage: int, stage_counts: Counter[int], accumulated: bool) -> float:
            """The step's own peak on ``stage`` of the ``chunks``, holding ``stage_counts`` blocks of
            each kind, at a backward after its first micro-batch's (``accumulated``) or at that one."""
            outside = {name for name, held in (("embeddings", stage == 0), ("head", stage == chunks - 1)) if held}
            added = _gradient_copies(buffered, layout.zero, accumulated)[1]
            # a stage after the first takes its input in torch's receive buffer, where its first block saves it, and a stage of one
            # block before the last the gradient of its output, where the copy's first and middle blocks take theirs made by the
            # block after them (the first of 4 one-block stages at 4 micro-batches +0.76% of MemTracker with it counted twice)
            gradient = boundary if stage < chunks - 1 and sum(stage_counts.values()) == 1 else 0.0
            return extrapolated_peak(copied, stage_counts, scales, shares, share(costs.outside_of(stage, chunks)), outside, added,
                                     boundary if stage > 0 else 0.0, gradient)
        stages = range(rank, chunks, layout.pp)  # the rank's chunks' stages (interleaved: one a round)
        if layout.virtual_stages > 1:
            kept, peak = self._interleaved_peak(layout, rank, micro_batches, costs, copied, peak_of, share, buffered, boundary, full)
        else:
            in_flight = min(micro_batches, layout.pp - rank)
            each = _kept_per_micro_batch(part, counts, rank > 0, copied, boundary, full)

            def at_backward(kept_in_flight: int, accumulated: bool) -> tuple[int, int]:
                """(the gradients kept, the step's peak) at a backward with ``kept_in_flight`` micro-batches
                in flight, after the first micro-batch (``accumulated``) or at it."""
                copies = _gradient_copies(buffered, layout.zero, accumulated)[0]
                # a stage before the last keeps each micro-batch's output it sent (the next stage's block saved it in the copy), and
                # once 1F1B is steady (the stage has forwarded micro-batch 2 (p - 1 - rank): both neighbours work in lock-step) one
                # sent boundary more at its later backwards, a tensor torch's process group still holds, referenced by no Python
                # object (4 gloo stages: from the first's fourth backward at 8 micro-batches, the second's third; at 4 micro-batches
                # the second stage never holds it: with it there it was +0.88% of MemTracker, without it at 8 -0.8%)
                steady = micro_batches > 2 * (layout.pp - 1 - rank)
                boundaries = (kept_in_flight + (accumulated and steady)) * boundary if rank < layout.pp - 1 else 0
                # a stage after the first still holds the gradient of its input it sent after the backward before (torch's 1F1B
                # drops its send ops only after the next backward)
                boundaries += boundary if rank > 0 and accumulated else 0
                return int(copies * gradients), int(peak_of(rank, counts, accumulated) + (kept_in_flight - 1) * each + boundaries)
            later = min(in_flight, micro_batches - 1)  # 1F1B forwards one more after each backward while any is left
            moments = [at_backward(later, True)] if micro_batches > 1 else []
            if later < in_flight or not moments:
                moments.append(at_backward(in_flight, False))
            kept, peak = max(moments, key=sum)
        received = sum((stage > 0) + (stage < chunks - 1) for stage in stages)
        return StageMemory(int(weights), kept, int(state), received * micro_batches * boundary, peak)

    def _interleaved_peak(self, layout: Layout, rank: int, micro_batches: int, costs: ModelCosts, copied: CopiedStep,
                          peak_of: Callable[[int, Counter[int], bool], float], share: Callable[[PartCosts], float], buffered: bool, boundary: int,
                          full: bool) -> tuple[int, int]:
        """(the gradients kept, the step's peak) of an interleaved rank, at the worst of its backwards
        in torch's order (:func:`.pipeline_order.interleaved_actions`): the stepping chunk's own
        peak (``peak_of``), the activations of every other (chunk, micro-batch) in flight, and what
        it sent so far. torch's interleaved schedule is a runtime schedule that waits for its sends
        at the step's end, and a send's work holds its tensor until then: every output a chunk sent
        and every input gradient it sent back stay. A chunk's gradients are made at its first
        backward, as in one micro-batch, and kept from then to the optimizer's step (with one
        micro-batch too: the rank's other chunk backwards after)."""
        chunks = layout.pp * layout.virtual_stages
        ranges = _split(costs.layers, chunks)
        stages = range(rank, chunks, layout.pp)
        activations, gradients, peaks = {}, {}, {}
        for stage in stages:
            start, end = ranges[stage]
            counts = Counter(costs.block_order[start:end])
            part = costs.stage(start, end, chunks, stage)
            activations[stage] = _kept_per_micro_batch(part, counts, stage > 0, copied, boundary, full)
            gradients[stage] = share(part)
            peaks.update({(stage, accumulated): peak_of(stage, counts, accumulated) for accumulated in (False, True)})
        held: dict[tuple[int, int], float] = {}
        sent, made, worst = 0, set(), (0.0, 0.0)
        for action in interleaved_actions(layout.pp, layout.virtual_stages, micro_batches, rank):
            key = (action.stage, action.micro_batch)
            if not action.backward:
                held[key] = activations[action.stage]
                sent += action.stage < chunks - 1
                continue
            kept = sum(_gradient_copies(buffered, layout.zero, stage in made)[0] * gradients[stage] for stage in stages)
            step = peaks[(action.stage, action.stage in made)] + sum(held.values()) - held.pop(key) + sent * boundary
            worst = max(worst, (kept, step), key=sum)
            sent += action.stage > 0
            made.add(action.stage)
        return int(worst[0]), int(worst[1])


def expert_count(model: nn.Module) -> Optional[int]:
    """The experts of each mixture-of-experts layer, where the model's config says."""
    config = getattr(model, "config", None)
    return next((value for name in ("num_local_experts", "num_experts", "n_routed_experts") if isinstance(value := getattr(config, name, None), int)), None)


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
        raise LayoutError(f"tp {tp} x pp {pp} x dp {dp}" + (f" x cp {cp}" if cp > 1 else "") + f" is {layout.gpus} GPUs, not the {gpus} given")
    link = interconnect_name if interconnect_name is not None else spec.name
    return Planner(model, sequence, global_batch, spec, link, optimizer).plan(layout, tokens, tp_overlap)

