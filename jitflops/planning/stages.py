"""What each part of a model costs one rank per micro-batch: its blocks, one of each kind, and what
lies outside them (embeddings, the last norm, the head and the loss), read from one recording.

A transformer repeats one block (a decoder layer; a mixture of experts may have two kinds, dense
and MoE layers). A copy of the model on the meta device keeps one block of each kind, ``tp`` ranks
of tensor parallelism are applied to it on a fake process group (the model's own plan, as the
memory estimate applies it), and one training micro-batch runs on it under the dispatch backend:
forward, and backward from its loss. Each op is priced on the device spec (:mod:`jitflops.estimates.roofline`),
each collective is taken as it was recorded (its bytes and group size), and each module's share is
read per phase: a block's is the block's, the rest is outside. The memory estimate of the same copy
(``memory_footprint(..., tensor_parallel=tp)``) gives each part's parameters and saved activations;
a rank's peak comes from the estimate of a copy with three blocks of each kind (:mod:`.step_peak`).
A stage of the pipeline is blocks and, on the first and last stages, the outside: costs add up.
:class:`ModelRecordings` keeps each recording per (tensor parallelism, micro-batch, sequence): a
search over layouts reuses them.
"""

from __future__ import annotations

import dataclasses
import inspect
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..core.model_io import ModelCall
from ..core.process_groups import is_dtensor
from ..core.records import FORWARD
from ..engine.counting import module_aliases
from ..engine.flop_count import FlopCountAnalysis
from ..estimates.costs.attention import ATTENTION_KERNELS
from ..estimates.devices import DeviceSpec, is_cpu_spec
from ..estimates.fake_sharding import fake_process_group, sharding_units, shard_like_tensor_parallel
from ..estimates.memory_estimate import MemoryEstimate
from ..estimates.memory_footprint import memory_footprint
from ..estimates.optimizers import optimizer_factory
from ..estimates.roofline import WHOLE_CALLS, predicted_statistics
from ..estimates.training_step_time import OptimizerStepRecording, record_optimizer_step
from ..frontends.dispatch_trace import DispatchTrace, loss_backward, record_with_dispatch
from ..frontends.meta_values import empty_copy
from ..handles import COMMUNICATION_FORMULAS, collective_of
from ..handles.collectives import Collective
from ..handles.traffic import tensor_bytes
from .step_peak import CopiedStep


@dataclass(frozen=True)
class PartCosts:
    """One part of the model on one rank, per micro-batch: compute seconds per phase, the collectives
    it ran (each with its phase), the bytes of its parameters and of what autograd saved for its
    backward; what context and expert parallelism split of it: its attention (the seconds of the
    ops whose work grows with the keys, and the keys and values its calls read) and its experts
    (their parameters' share, and the rows the router sends them)."""

    forward_s: float
    backward_s: float
    collectives: tuple[tuple[str, Collective], ...]
    parameter_bytes: int
    gradient_bytes: int
    state_bytes: int
    """The optimizer's state (AdamW's two moments, say), as the memory estimate's step made it."""
    activation_bytes: int
    attention_forward_s: float = 0.0
    attention_backward_s: float = 0.0
    attention_calls: int = 0
    key_value_bytes: int = 0
    """The keys and values its attention calls read, in all (one rank's, at the sequence recorded)."""
    expert_parameter_bytes: int = 0
    expert_gradient_bytes: int = 0
    expert_state_bytes: int = 0
    expert_calls: int = 0
    """Its mixture-of-experts layers' calls of their experts."""
    dispatched_bytes: int = 0
    """The rows the routers send the experts, in all: a row per token and expert chosen, of the hidden size."""
    optimizer_kernel_s: float = 0.0
    """The optimizer's steady step on its parameters (as tensor parallelism shards them): its kernels'
    seconds, which ZeRO's sharding divides, and (below) the host's, which it does not."""
    optimizer_host_s: float = 0.0
    parameter_tensors: int = 0
    """Its parameters' tensors (FSDP2 makes each a DTensor)."""
    dtensor_parameters: int = 0
    """Those of them tensor parallelism made DTensors (the optimizer's host time above has their dispatch)."""

    def __add__(self, other: "PartCosts") -> "PartCosts":
        return PartCosts(*(getattr(self, field.name) + getattr(other, field.name) for field in dataclasses.fields(PartCosts)))

NOTHING = PartCosts(0.0, 0.0, (), 0, 0, 0, 0)


@dataclass(frozen=True)
class ModelCosts:
    """A model's parts on one rank of tensor parallelism: what lies before its blocks (the
    embeddings, on a pipeline's first stage), what lies after them (the last norm, the head and the
    loss, on its last stage), and one block of each kind."""

    embeddings: PartCosts
    head: PartCosts
    blocks: tuple[PartCosts, ...]
    block_order: tuple[int, ...]
    """Each of the model's blocks, in order, by the index of its kind in :attr:`blocks`."""

    @property
    def layers(self) -> int:
        return len(self.block_order)

    @property
    def outside(self) -> PartCosts:
        return self.embeddings + self.head

    def outside_of(self, index: int, stages: int) -> PartCosts:
        """What stage ``index`` of ``stages`` holds outside the blocks: the embeddings on the first, the head on the last."""
        return (self.embeddings if index == 0 else NOTHING) + (self.head if index == stages - 1 else NOTHING)

    def stage(self, first: int, last: int, stages: int, index: int) -> PartCosts:
        """Stage ``index`` of ``stages``, holding blocks ``first`` to ``last`` (exclusive) and what lies outside them there."""
        total = self.outside_of(index, stages)
        for kind in self.block_order[first:last]:
            total = total + self.blocks[kind]
        return total


ATTENTION_OPS = frozenset({kernel.partition("::")[2] for kernel in ATTENTION_KERNELS}
                          | {f"{kernel.partition('::')[2]}_backward" for kernel in ATTENTION_KERNELS[1:]}
                          | {"bmm", "baddbmm", "_softmax", "_safe_softmax", "_softmax_backward_data"})
"""The ops of attention whose work grows with the keys, read in the modules that call attention:
the fused kernels forward and backward, and the math path's products and softmaxes."""


def _signature(block: nn.Module) -> tuple[Any, ...]:
    """What makes two blocks cost the same: their class and their parameters' shapes."""
    return (type(block).__name__, tuple(tuple(parameter.shape) for parameter in block.parameters()))


def block_list(model: nn.Module) -> tuple[nn.Module, list[nn.Module]]:
    """The ``nn.ModuleList`` holding the model's repeated blocks (those FSDP2 would shard), and the blocks in order."""
    blocks = sharding_units(model)
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and any(child is blocks[0] for child in module._modules.values()):
            return module, [child for child in module._modules.values() if child is not None]
    raise ValueError(f"{type(model).__name__}'s blocks ({type(blocks[0]).__name__}) are not held in an nn.ModuleList: it cannot be cut into pipeline stages")


class ModelRecordings:
    """A model's recordings and memory estimates per (tensor parallelism, micro-batch, sequence), made once each."""

    def __init__(self, model: nn.Module, optimizer: str = "adamw") -> None:
        if "labels" not in inspect.signature(model.forward).parameters:
            raise ValueError(f"a plan trains a model whose forward takes input_ids and labels and returns its loss (a transformers ...ForCausalLM): "
                             f"{type(model).__name__}'s forward takes no labels")
        self.model, self.optimizer = model, optimizer
        self._container, self._blocks = block_list(model)
        blocks = self._blocks
        kinds: dict[tuple[Any, ...], int] = {}
        self.block_order = tuple(kinds.setdefault(_signature(block), len(kinds)) for block in blocks)
        self._firsts = [self.block_order.index(kind) for kind in range(len(kinds))]
        self._recordings: dict[tuple[int, int, int, bool], tuple[DispatchTrace, nn.Module, list[str]]] = {}
        self._optimizer_steps: dict[tuple[int, bool], dict[str, OptimizerStepRecording]] = {}
        self._memory: dict[tuple[int, int, int], MemoryEstimate] = {}
        self._step_memory: dict[tuple[int, int, int, bool, bool], CopiedStep] = {}
        self._costs: dict[tuple[Any, ...], tuple[DeviceSpec, ModelCosts]] = {}
        self._cut: dict[int, tuple[nn.Module, list[str]]] = {}

    @property
    def layers(self) -> int:
        return len(self.block_order)

    def _cut_copy(self, micro_batch: int, sequence: int, each: int = 1) -> tuple[nn.Module, ModelCall, list[str]]:
        """A meta copy of the model holding ``each`` blocks of each kind (as many as the model has, if
        fewer; renumbered from 0, a kind's together), its loss's call, and those blocks' names."""
        if each not in self._cut:  # the whole model is walked once per ``each``; each copy after is of the cut one
            cut, _, copies = empty_copy(self.model, ModelCall((), {}))
            for module in cut.modules():  # a layout's recompute says what is checkpointed, not the user's own switch (the copy's own modules)
                if getattr(module, "gradient_checkpointing", False):
                    module.gradient_checkpointing = False
            kept = [position for kind in range(len(self._firsts)) for position in [index for index, order in enumerate(self.block_order) if order == kind][:each]]
            copies[self._container]._modules = {str(index): copies[self._blocks[position]] for index, position in enumerate(kept)}
            names = {module: name for name, module in cut.named_modules()}
            self._cut[each] = (cut, [names[copies[self._blocks[position]]] for position in kept])
        cut, names = self._cut[each]
        ids = torch.zeros(micro_batch, sequence, dtype=torch.long, device="meta")
        twin, call, _ = empty_copy(cut, ModelCall((), {"input_ids": ids, "labels": ids}))
        return twin, call, names

    def forward_flops(self, sequence: int) -> float:
        """The whole model's forward FLOPs on one sequence of ``sequence`` tokens (no cache, no loss),
        counted on the cut copy: its total, and each kind's block once more for every other block of
        that kind (a 70B model's 80 blocks are one block's count 80 times, without tracing 80)."""
        twin, _, names = self._cut_copy(1, sequence)
        ids = torch.zeros(1, sequence, dtype=torch.long, device="meta")
        analysis = FlopCountAnalysis(twin, (), {"input_ids": ids, "use_cache": False}).unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        per_module = analysis.by_module()
        repeats = sum((self.block_order.count(kind) - 1) * per_module[name] for kind, name in enumerate(names))
        return 2.0 * (analysis.total() + repeats)

    def recording(self, tp: int, micro_batch: int, sequence: int, gpu: bool = False) -> tuple[DispatchTrace, nn.Module, list[str]]:
        """One training micro-batch of the cut copy on one rank of ``tp``; ``gpu``: its attention by a
        GPU's fused kernels (grouped queries and dropout too); else by the kernel a CPU would choose."""
        key = (tp, micro_batch, sequence, gpu)
        if key not in self._recordings:
            twin, call, names = self._cut_copy(micro_batch, sequence)
            twin.train()
            with fake_process_group(tp) if tp > 1 else nullcontext() as mesh:
                if tp > 1:
                    shard_like_tensor_parallel(twin, mesh)
                recording = record_with_dispatch(twin, call, module_aliases(twin), loss_backward, guarded=False, whole=WHOLE_CALLS, whole_as_on_a_gpu=gpu)
                if (tp, gpu) not in self._optimizer_steps:  # the parameters' shards do not change with the micro-batch
                    self._optimizer_steps[(tp, gpu)] = self._optimizer_steps_of(twin, names, gpu)
            self._recordings[key] = (recording, twin, names)
        return self._recordings[key]

    def _optimizer_steps_of(self, twin: nn.Module, names: list[str], gpu: bool) -> dict[str, OptimizerStepRecording]:
        """The optimizer's steady step on the parameters of each block, of each module holding the
        embeddings, and of the rest (the head's, ""), of the cut copy, recorded (``foreach`` on a GPU,
        per tensor on a CPU, as torch's defaults are)."""
        factory = optimizer_factory(self.optimizer, foreach=gpu)
        blocks = {name: list(twin.get_submodule(name).parameters()) for name in names + self._embeddings_of(twin, names)}
        inside = {id(parameter) for parameters in blocks.values() for parameter in parameters}
        blocks[""] = [parameter for parameter in twin.parameters() if id(parameter) not in inside]
        return {name: record_optimizer_step(parameters, factory) for name, parameters in blocks.items() if parameters}

    def memory(self, tp: int, micro_batch: int, sequence: int) -> MemoryEstimate:
        """The training step's memory estimate of the cut copy on one rank of ``tp``: each part's
        parameters, gradients, optimizer state and saved activations."""
        key = (tp, micro_batch, sequence)
        if key not in self._memory:
            twin, call, _ = self._cut_copy(micro_batch, sequence)
            self._memory[key] = memory_footprint(twin, (), call.kwargs, train=self.optimizer, tensor_parallel=tp if tp > 1 else None)
        return self._memory[key]

    def step_memory(self, tp: int, micro_batch: int, sequence: int, fsdp: bool = False, checkpointing: bool = False) -> CopiedStep:
        """The training step's memory estimate of the copy holding three blocks of each kind (one
        between two others: under FSDP2 it prefetches its neighbour's weights while the other's
        gradients are still being reduced, :mod:`jitflops.planning.step_peak`), on one rank of ``tp``; with
        ``fsdp``, FSDP2 over 2 ranks on top; with ``checkpointing``, each block recomputed in the
        backward (the model's own activation checkpointing); read by block."""
        key = (tp, micro_batch, sequence, fsdp, checkpointing)
        if key not in self._step_memory:
            twin, call, names = self._cut_copy(micro_batch, sequence, each=3)
            estimate = memory_footprint(twin, (), call.kwargs, train=self.optimizer, tensor_parallel=tp if tp > 1 else None, fsdp=2 if fsdp else None,
                                        checkpointing=checkpointing)
            kinds = [kind for kind in range(len(self._firsts)) for _ in range(min(3, self.block_order.count(kind)))]
            self._step_memory[key] = CopiedStep(estimate.step, names, kinds)
        return self._step_memory[key]

    def sequence_split(self, tp: int, micro_batch: int, sequence: int) -> list[float]:
        """Per kind of block, the share of its saved activations on a rank of ``tp`` that sequence
        parallelism keeps (:func:`_split_sequence`: the unsharded block's over ``tp``)."""
        _, _, names = self._cut_copy(micro_batch, sequence)
        sharded, unsharded = self.memory(tp, micro_batch, sequence).modules, self.memory(1, micro_batch, sequence).modules
        return [unsharded[name].saved_activations // tp / sharded[name].saved_activations if sharded[name].saved_activations else 1.0 for name in names]

    def costs(self, tp: int, micro_batch: int, sequence: int, spec: DeviceSpec, mode: str = "eager", sequence_parallel: bool = False) -> ModelCosts:
        """Each part of the model on one rank of ``tp``, per micro-batch of ``micro_batch`` sequences
        of ``sequence`` tokens, on ``spec``; with ``sequence_parallel``, each block's split as Megatron's
        sequence parallelism splits it (:func:`_split_sequence`)."""
        sequence_parallel = sequence_parallel and tp > 1
        key = (tp, micro_batch, sequence, id(spec), mode, sequence_parallel)
        if key not in self._costs or self._costs[key][0] is not spec:
            self._costs[key] = (spec, self._priced(tp, micro_batch, sequence, spec, mode, sequence_parallel))
        return self._costs[key][1]

    def _priced(self, tp: int, micro_batch: int, sequence: int, spec: DeviceSpec, mode: str, sequence_parallel: bool) -> ModelCosts:
        gpu = not is_cpu_spec(spec)
        recording, twin, names = self.recording(tp, micro_batch, sequence, gpu=gpu)
        statistics = predicted_statistics(recording, spec, mode, module_aliases(twin), ignored=COMMUNICATION_FORMULAS.kinds())  # priced by their links
        steps = self._optimizer_steps[(tp, gpu)]
        repeats = {name: self.block_order.count(kind) for kind, name in enumerate(names)}  # each kind's block as often as the model has it:
        touched = sum(step.touched_bytes * repeats.get(name, 1) for name, step in steps.items())  # the whole model's state on a rank of tp
        optimizer = {name: [sum(predicted_statistics(step.trace, each.for_optimizer_step(touched), mode, {}).counts[""].values()) for each in (spec, spec.kernels_only())]
                     for name, step in steps.items()}
        memory = self.memory(tp, micro_batch, sequence)
        collectives = [(scope, record.phase, collective_of(record)) for scope, record in recording.records if record.kind in COMMUNICATION_FORMULAS.kinds()]

        def within(scope: str, name: str) -> bool:
            return not name or f"/{name}/" in f"{scope}/"

        def holds(name: str, module: str) -> bool:
            return not name or module == name or module.startswith(f"{name}.")

        experts = expert_modules(twin, names)
        attention = [(scope, record) for scope, record in recording.records if record.phase == FORWARD and record.kind in ATTENTION_KERNELS]
        dispatches = {name: _dispatched_bytes(recording, name) for name in experts}

        def part(name: str) -> PartCosts:
            seconds = statistics.counts[name]
            backward = sum(value for key, value in seconds.items() if _in_backward(key))
            inside = tuple((phase, collective) for scope, phase, collective in collectives if within(scope, name))
            calls = [record for scope, record in attention if within(scope, name)]
            quadratic = [(key, value) for module in {scope.rpartition("/")[2] for scope, _ in attention if within(scope, name)}
                         for key, value in statistics.counts[module].items() if key.rpartition(".")[2] in ATTENTION_OPS]
            attention_backward = sum(value for key, value in quadratic if _in_backward(key))
            attention_forward = sum(value for key, value in quadratic) - attention_backward
            key_values = sum(tensor_bytes(record.input(1)) + tensor_bytes(record.input(2)) for record in calls)
            own_experts = [memory.modules[expert] for expert in experts if holds(name, expert)]
            module = memory.modules[name]
            tensors = list(twin.get_submodule(name).parameters())
            step_s, kernels_s = optimizer.get(name, (0.0, 0.0)) if name else [sum(each) for each in zip(*optimizer.values())]
            return PartCosts(sum(seconds.values()) - backward, backward, inside, module.parameters, module.gradients, module.optimizer_state, module.saved_activations,
                             attention_forward, attention_backward, len(calls), key_values, sum(each.parameters for each in own_experts),
                             sum(each.gradients for each in own_experts), sum(each.optimizer_state for each in own_experts), len(own_experts),
                             sum(dispatched for expert, dispatched in dispatches.items() if holds(name, expert)),
                             kernels_s, step_s - kernels_s, len(tensors), sum(map(is_dtensor, tensors)))

        blocks = [part(name) for name in names]
        root = part("")
        if sequence_parallel:
            unsharded = self.memory(1, micro_batch, sequence)
            blocks = [_split_sequence(block, twin.get_submodule(name), name, statistics.counts, unsharded.modules[name].saved_activations, tp)
                      for block, name in zip(blocks, names)]
        before = [name for name in self._embeddings_of(twin, names) if name in statistics.counts]
        embeddings = sum((part(name) for name in before), NOTHING)
        head_collectives = tuple((phase, collective) for scope, phase, collective in collectives if not any(within(scope, name) for name in names + before))
        rest = [getattr(root, field.name) - sum(getattr(each, field.name) for each in (*blocks, embeddings))
                for field in dataclasses.fields(PartCosts) if field.name != "collectives"]
        return ModelCosts(embeddings, PartCosts(rest[0], rest[1], head_collectives, *rest[2:]), tuple(blocks), self.block_order)

    @staticmethod
    def _embeddings_of(twin: nn.Module, blocks: list[str]) -> list[str]:
        """The modules of the cut copy that hold its embeddings (:func:`modules_before` its blocks)."""
        return modules_before(blocks[0].rpartition(".")[0], twin)


def expert_modules(model: nn.Module, blocks: list[str]) -> list[str]:
    """The experts of each block that expert parallelism splits: the modules the model's own
    expert-parallel plan (a transformers config's ``base_model_ep_plan``) dispatches tokens to."""
    plan = getattr(getattr(model, "config", None), "base_model_ep_plan", None) or {}
    paths = [pattern.split("*.", 1)[1] for pattern, style in plan.items() if style == "ep_dispatch_experts" and "*." in pattern]
    found = []
    for block in blocks:
        for path in paths:
            try:
                model.get_submodule(f"{block}.{path}")
            except AttributeError:
                continue
            found.append(f"{block}.{path}")
    return found


def _dispatched_bytes(recording: DispatchTrace, experts: str) -> int:
    """The rows an experts module's forward received (a row per token and expert chosen): its first
    grouped product's input."""
    return next((tensor_bytes(record.input(0)) for scope, record in recording.records
                 if record.phase == FORWARD and record.kind == "aten::_grouped_mm" and f"/{experts}/" in f"{scope}/"), 0)


def _in_backward(key: str) -> bool:
    """Whether a key of the predicted statistics (``op`` in the forward, ``phase.op`` after it) is a backward op's."""
    return "." in key and key.partition(".")[0] != FORWARD


def _split_sequence(block: PartCosts, module: nn.Module, name: str, seconds: dict[str, dict[str, float]], unsharded_activations: int, tp: int) -> PartCosts:
    """A block under sequence parallelism (Korthikanti et al., 2022): what tensor parallelism leaves
    whole on every rank (the norms, the residual additions, the dropouts: the block's own ops and
    its children that hold no sharded parameter) runs on ``1/tp`` of the sequence, and every
    activation the block keeps is split ``tp`` ways: the unsharded block's (``unsharded_activations``)
    over ``tp``. The all-reduces become all-gathers and reduce-scatters of the same bytes on a ring."""
    from torch.distributed.tensor import DTensor  # imported where sharding is: it costs seconds
    sharded = [f"{name}.{child}" for child, submodule in module.named_children()
               if any(isinstance(parameter, DTensor) for parameter in submodule.parameters())]

    def whole(backward: bool) -> float:
        def phase_seconds(scope: str) -> float:
            return sum(value for key, value in seconds.get(scope, {}).items() if _in_backward(key) == backward)
        return phase_seconds(name) - sum(phase_seconds(child) for child in sharded)
    saved = 1 - 1 / tp
    return dataclasses.replace(block, forward_s=block.forward_s - saved * whole(False), backward_s=block.backward_s - saved * whole(True),
                               activation_bytes=unsharded_activations // tp)


def modules_before(container: str, model: nn.Module) -> list[str]:
    """The modules that hold the embeddings: at each level from the root to the blocks' container
    (a dotted name), the children registered before the branch that leads to it."""
    found, path = [], ""
    for part in container.split("."):
        parent = model.get_submodule(path)
        for child in parent._modules:
            if child == part:
                break
            found.append(f"{path}.{child}" if path else child)
        path = f"{path}.{part}" if path else part
    return found
