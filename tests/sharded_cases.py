"""What each rank of the multi-process tests runs (``tests/test_sharded.py``): a model sharded by one
of torch.distributed's engines, counted by jitflops and watched by torch's own ``CommDebugMode``.

Each case returns plain figures (JSON) that the test, in the parent process, holds against hand
counts. Every rank builds the same model from the same seed, so an unsharded copy is at hand.
"""

from __future__ import annotations

import faulthandler
import inspect
import json
import os
import re
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from jitflops import ActivationCountAnalysis, CommunicationAnalysis, FlopCountAnalysis, FlopsProfiler, get_model_profile, profile_model, record_collectives
from jitflops.reports.deepspeed_report import format_model_profile
from jitflops.reports.files import profile_to_dict

BATCH, D_IN, D_HIDDEN = 8, 64, 256


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, D_HIDDEN), nn.ReLU(), nn.Linear(D_HIDDEN, D_IN))


def comm_debug_mode() -> Any:
    """Torch's ``CommDebugMode``, its module tracker hooking each module once.

    Torch's tracker adds a forward hook to a module at each of its calls and, on leaving, removes
    one per module name. A module called more than once in a forward pops its parent list once per
    hook, and keeps the hooks after the mode: a function that transformers 5.25 makes a module
    through the ``kernels`` package (``apply_rotary_pos_emb``, one module for every layer of every
    model) failed the second layer's forward (``IndexError``) and every later forward of the process.
    Only its module bookkeeping changes: what it counts is its dispatch mode's."""
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.debug._comm_mode import _CommModeModuleTracker

    class HookingOnce(_CommModeModuleTracker):
        def __enter__(self) -> Any:
            self.hooked: dict[nn.Module, Any] = {}
            return super().__enter__()

        def _fw_pre_hook(self, mod: nn.Module, input: Any) -> None:
            super()._fw_pre_hook(mod, input)
            if not self.activation_checkpointing:  # the hook it has just added
                handle = self.register_forward_hook_handles.pop(self.name)
                if mod in self.hooked:
                    handle.remove()
                else:
                    self.hooked[mod] = handle

        def __exit__(self, *args: Any) -> None:
            super().__exit__(*args)
            for handle in self.hooked.values():
                handle.remove()

    mode = CommDebugMode()
    mode.advanced_module_tracker = HookingOnce()
    return mode


def comm_debug_counts(run: Callable[[], Any]) -> tuple[dict[str, int], list[str]]:
    """``CommDebugMode``'s collective counts for one run, keyed by the op's short name, and the
    modules it saw run collectives (canonical names: the root is "", its tracker's "Global" left out)."""
    with comm_debug_mode() as mode:
        run()
    counts = {str(op).rpartition(".")[2]: count for op, count in mode.get_comm_counts().items()}
    modules = sorted(
        name.partition(".")[2] for name, phases in mode.comm_module_counts.items()
        if name != "Global" and any(sum(ops.values()) for ops in phases.values() if isinstance(ops, dict))
    )
    return counts, modules


def collectives(analysis: CommunicationAnalysis) -> dict[str, list]:
    return {key: [t.calls, t.bytes, t.bus_bytes, list(t.group_sizes)] for key, t in analysis.by_collective().items()}


def state_of(model: nn.Module) -> dict[str, Any]:
    """What a count must leave as it was: each parameter's class, local shard, placements and gradient."""
    state = {}
    for name, parameter in model.named_parameters():
        local = getattr(parameter, "_local_tensor", parameter)
        state[name] = [type(parameter).__name__, list(local.shape), str(getattr(parameter, "placements", None)), float(local.detach().double().sum()), parameter.grad is None]
    return state


def counted(model: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """The default call's forward count, the dispatch backend's forward and backward, and the collectives."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        forward = FlopCountAnalysis(model, x).unsupported_ops_warnings(False)
        step = FlopCountAnalysis(model, x, backend="dispatch", backward=True).unsupported_ops_warnings(False)
        communication = CommunicationAnalysis(model, x, backend="dispatch", backward=True)
        figures = {
            "forward": forward.total(),
            "counted_by": forward.counted_by,
            "unsupported": sorted(forward.unsupported_ops()) + sorted(step.unsupported_ops()),
            "phases": dict(step.by_phase()),
            "collectives": collectives(communication),
            "comm_modules": sorted(name for name, n in communication.by_module().items() if n),
        }
    figures["comm_debug"], figures["comm_debug_modules"] = comm_debug_counts(lambda: model(x).float().sum().backward())
    for parameter in model.parameters():
        parameter.grad = None
    return figures


def tensor_parallel(rank: int, world: int) -> dict[str, Any]:
    """The issue's MLP, Colwise then Rowwise; a LayerNorm before it, replicated (every rank runs it
    whole) or sequence parallel (each rank its share of the tokens)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    figures: dict[str, Any] = {}

    model = mlp()
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(BATCH, D_IN, requires_grad=True)
    before = state_of(model)
    figures["mlp"] = counted(model, x)
    figures["mlp"]["state_kept"] = state_of(model) == before
    profile = profile_model(model, x.detach(), repeats=2, peak_flops=1e12, with_ops=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        figures["mlp"]["activations"] = ActivationCountAnalysis(model, x.detach()).total()
        figures["mlp"]["get_model_profile_macs"] = get_model_profile(model, args=(x.detach(),), print_profile=False, as_string=False, warm_up=0, repeats=1)[1]
    figures["mlp"]["timed_collectives"] = [[row.op, row.time_s > 0] for row in profile.op_rows if "c10d" in row.op]
    figures["mlp"]["profile"] = {
        "gathered_macs": profile.root.macs,
        "parallel": [profile.summary.parallel.world, profile.summary.parallel.data_parallel, profile.summary.parallel.model_parallel],
        "collectives": [t.as_dict() for t in profile.summary.collectives],
        "text": format_model_profile(profile, module_depth=0),
        "json": profile_to_dict(profile)["summary"],
        "ranks": len(profile.ranks),
    }

    def norm_then_mlp() -> nn.Sequential:
        torch.manual_seed(0)
        return nn.Sequential(nn.LayerNorm(D_IN), *mlp())

    unsharded = norm_then_mlp()
    tokens = torch.randn(2, BATCH, D_IN)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        figures["unsharded_norm_mlp"] = FlopCountAnalysis(unsharded, tokens).total()
        figures["unsharded_norm"] = FlopCountAnalysis(unsharded[0], tokens).total()
        # under sequence parallelism each rank's input is its shard of a sequence ``world`` times longer
        figures["unsharded_sequence"] = FlopCountAnalysis(unsharded, torch.randn(2, BATCH * world, D_IN)).total()
    replicated = norm_then_mlp()
    parallelize_module(replicated, mesh, {"1": ColwiseParallel(), "3": RowwiseParallel()})
    figures["replicated_norm"] = counted(replicated, tokens)
    sequence = norm_then_mlp()
    parallelize_module(
        sequence, mesh,
        {"0": SequenceParallel(), "1": ColwiseParallel(input_layouts=Shard(1)), "3": RowwiseParallel(output_layouts=Shard(1))},
    )
    figures["sequence_parallel"] = counted(sequence, tokens)
    return figures


def data_parallel(rank: int, world: int) -> dict[str, Any]:
    """FSDP2 (``fully_shard`` per Linear and at the root) and DDP, each rank on its own batch."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    x = torch.randn(BATCH, D_IN)
    fsdp = mlp()
    for layer in (fsdp[0], fsdp[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(fsdp, mesh=mesh)
    before = state_of(fsdp)
    figures = {"fsdp2": counted(fsdp, x)}
    figures["fsdp2"]["state_kept"] = state_of(fsdp) == before
    profile = profile_model(fsdp, x, timed=False)
    figures["fsdp2"]["parallel"] = [profile.summary.parallel.world, profile.summary.parallel.data_parallel, profile.summary.parallel.model_parallel]
    ddp = nn.parallel.DistributedDataParallel(mlp())
    ddp(x).sum().backward()  # DDP's first iteration also broadcasts and rebuilds its buckets
    ddp.zero_grad(set_to_none=True)
    figures["ddp"] = counted(ddp, x)
    return figures


class ExpertParallelMoE(nn.Module):
    """Four experts, two per rank; token i goes to expert i mod 4 (so to rank (i mod 4) // 2), and
    tokens are exchanged all-to-all there and back, as expert parallelism does."""

    def __init__(self, world: int, d_model: int = 16, d_expert: int = 32) -> None:
        super().__init__()
        self.world = world
        self.experts = nn.ModuleList(nn.Linear(d_model, d_expert, bias=False) for _ in range(4 // world))
        self.d_expert = d_expert

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        order = sorted(range(tokens.shape[0]), key=lambda i: (i % 4) // (4 // self.world))  # grouped by destination rank
        sent = tokens[order]
        split = [tokens.shape[0] // self.world] * self.world
        received = all_to_all_single_autograd(sent, split, split, dist.group.WORLD)
        per_expert = received.shape[0] // len(self.experts)
        outputs = torch.cat([expert(received[i * per_expert:(i + 1) * per_expert]) for i, expert in enumerate(self.experts)])
        return all_to_all_single_autograd(outputs, split, split, dist.group.WORLD)


def expert_parallel(rank: int, world: int) -> dict[str, Any]:
    torch.manual_seed(rank)
    model = ExpertParallelMoE(world)
    return {"moe": counted(model, torch.randn(BATCH, 16, requires_grad=True))}


def pipeline(rank: int, world: int) -> dict[str, Any]:
    """One stage per rank, GPipe over two micro-batches; the second step is measured."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.manual_seed(rank)
    stage_module = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    micro_batch = torch.randn(4, 32)
    shapes = {"input_args": (micro_batch,), "output_args": (micro_batch,), "output_grads": (micro_batch,), "input_grads": (micro_batch,)}
    accepted = inspect.signature(PipelineStage).parameters  # torch 2.11's stage takes no gradients' shapes
    stage = PipelineStage(stage_module, rank, world, torch.device("cpu"), **{name: shape for name, shape in shapes.items() if name in accepted})
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda output, target: (output - target).pow(2).sum())

    def step() -> None:
        if rank == 0:
            schedule.step(torch.randn(8, 32))
        else:
            schedule.step(target=torch.randn(8, 32))

    step()
    profiler = FlopsProfiler(stage_module)
    profiler.start_profile()
    with record_collectives() as log:
        step()
    profile = profiler.profile()
    profiler.end_profile()
    dist.barrier()  # the last sends complete before the process group goes
    return {
        "macs": profile.summary.macs,
        "forwards": profile.summary.forwards,
        "collectives": {key: [t.calls, t.bytes, t.seconds is not None and t.seconds > 0] for key, t in log.by_collective().items()},
    }


def read_on_rank_0(rank: int, world: int) -> dict[str, Any]:
    """What people write: every rank makes the analyses of a tensor-parallel MLP, rank 0 alone reads
    them (a total, the table with activations, the mask-aware count), then the training step's next
    all_reduce runs on every rank. The analyses' forward (its all_reduce) ran when they were made, on
    every rank: rank 0's reads run no collective, and the step's all_reduce pairs with itself."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from jitflops import flop_count_table

    model = mlp()
    parallelize_module(model, init_device_mesh("cpu", (world,)), {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(BATCH, D_IN)
    with warnings.catch_warnings(), comm_debug_mode() as made:
        warnings.simplefilter("ignore")
        flops, activations = FlopCountAnalysis(model, x), ActivationCountAnalysis(model, x)
    figures: dict[str, Any] = {"collectives_when_made": made.get_total_counts()}
    if rank == 0:
        with comm_debug_mode() as read:
            figures["total"] = flops.total()
            figures["table"] = flop_count_table(flops, activations=activations, masked_attention=True)
            figures["activations"] = activations.total()
        figures["collectives_when_read"] = read.get_total_counts()
    step = torch.full((3 * world + 1,), float(rank + 1))  # the step's own all_reduce: another size than the MLP's
    dist.all_reduce(step)
    figures["step_all_reduce"] = step.tolist()
    figures["total_after"] = flops.total()
    return figures


def faults(rank: int, world: int) -> dict[str, Any]:
    """A rank whose profile raises, then a rank that does not profile at all."""
    model = mlp()
    errors = {}
    x = torch.randn(BATCH, D_IN if rank == 0 else D_IN + 1)  # rank 1's input does not fit the model
    try:
        profile_model(model, x, timed=False)
    except Exception as error:
        errors["raises"] = f"{type(error).__name__}: {error}"
    if rank == 0:
        try:
            profile_model(model, torch.randn(BATCH, D_IN), timed=False)
        except Exception as error:
            errors["absent"] = f"{type(error).__name__}: {error}"
    errors["state_kept"] = all(p.grad is None for p in model.parameters())
    return errors


def small_gpt(device: str = "cpu") -> nn.Module:
    """The GPT ``tests/test_plan.py`` plans: 4 blocks of width 256, float32, seeded."""
    import transformers

    config = transformers.AutoConfig.for_model("starcoder2", hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                                               num_key_value_heads=8, vocab_size=1024, max_position_embeddings=512, tie_word_embeddings=False,
                                               bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(config)


def memtracker_peak(step: Callable[[], None], *tracked: Any) -> int:
    """MemTracker's peak on the CPU of ``step``, with ``tracked`` (a model, its optimizer, tensors or
    None: made before it started) taken in, its per-module statistics off: its module hooks take a
    root module's second forward for a second step, a pipeline runs one a micro-batch, and their
    gradient hooks hold a module's output gradients until the last of them arrives, which no step
    without them holds (transformers 5.25's rotary function, a module of two outputs: 65,024 bytes
    more on each rank of FSDP2 by tensor parallelism)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(*(each for each in tracked if each is not None))
    with tracker:
        tracker._mod_tracker.__exit__()
        step()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def planned_layouts(rank: int, world: int) -> dict[str, Any]:
    """The small GPT's training micro-batch (forward, and backward from its loss) as the plan's
    layouts run it: tensor parallelism by the model's own plan, FSDP2 (each block, then the root),
    over the ``world`` ranks, and on 4 ranks FSDP2 over 2 by tensor parallelism over 2 (a 2-D
    mesh); the collectives ``CommDebugMode`` sees, and their bytes; MemTracker's peak of a steady
    step with AdamW, its output kept through the backward as the memory estimate's step keeps it
    (the least of 3: gloo's thread may hold a buffer a little longer; in a fresh clone's full suite on
    2026-12-06 the largest rank's peak was 135,424 bytes over in both of 2 steps); the bytes DDP's backward
    copies beyond the plain model's (its gradients into its buckets), and DDP's peak (:func:`_ddp_peak`)."""
    from torch.distributed.device_mesh import init_device_mesh

    from jitflops.estimates.fake_sharding import shard_like_fsdp2, shard_like_tensor_parallel

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(1)
    ids = torch.randint(0, 1024, (1, 128))
    figures: dict[str, Any] = {}
    layouts: dict[str, Callable[[nn.Module], None]] = {"tensor_parallel": lambda model: shard_like_tensor_parallel(model, mesh),
                                                       "fsdp2": lambda model: shard_like_fsdp2(model, mesh)}
    if world == 4:
        grid = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        layouts["fsdp2_by_tensor_parallel"] = lambda model: (shard_like_tensor_parallel(model, grid["tp"]), shard_like_fsdp2(model, grid["dp"]))
    for name, shard in layouts.items():
        model = small_gpt()
        shard(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            figures[name] = {"collectives": collectives(CommunicationAnalysis(model, (), {"input_ids": ids, "labels": ids}, backend="dispatch", backward=True))}
        optimizer = torch.optim.AdamW(model.parameters())

        def step() -> None:  # the memory estimate's step: the output kept through the backward
            output = model(input_ids=ids, labels=ids)
            output.loss.backward()
            del output
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        figures[name]["comm_debug"] = comm_debug_counts(step)[0]  # the first step, the optimizer's (on local shards) running none
        figures[name]["peak"] = min(memtracker_peak(step, model, optimizer) for _ in range(3)) + ids.nbytes  # the input, made before MemTracker started
    figures["ddp_copied_bytes"] = _backward_copied_bytes(nn.parallel.DistributedDataParallel(small_gpt()), ids) - _backward_copied_bytes(small_gpt(), ids)
    figures["ddp_peak"] = _ddp_peak(ids)
    return figures


def _ddp_peak(ids: torch.Tensor) -> int:
    """MemTracker's peak of 3 steps with AdamW of the small GPT under torch's DDP (its defaults: the
    gradients copied into buckets), the DDP wrapper made under the tracker so that it sees the
    buckets; the output kept through the backward as in :func:`planned_layouts`."""
    model = small_gpt()

    def steps() -> None:
        replica = nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(model.parameters())
        for _ in range(3):
            output = replica(input_ids=ids, labels=ids)
            output.loss.backward()
            del output
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return memtracker_peak(steps, model) + ids.nbytes


def _backward_copied_bytes(model: nn.Module, ids: torch.Tensor) -> int:
    """The bytes the ``copy_`` ops of a training micro-batch's backward write (after a first one:
    DDP builds its buckets then)."""
    from jitflops.core.model_io import ModelCall
    from jitflops.core.records import FORWARD
    from jitflops.engine.counting import module_aliases
    from jitflops.frontends.dispatch_trace import loss_backward, record_with_dispatch

    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)
    recording = record_with_dispatch(model, ModelCall((), {"input_ids": ids, "labels": ids}), module_aliases(model), loss_backward, guarded=False)
    copies = [record.outputs[0] for _, record in recording.records if record.phase != FORWARD and record.kind == "aten::copy_"]
    return sum(meta.numel * meta.dtype.itemsize for meta in copies)


def transformers_expert_parallel(rank: int, world: int) -> dict[str, Any]:
    """A small Mixtral's training micro-batch under transformers' own expert parallelism (its
    ``AllToAllEP``, FSDP2 over the ``world`` ranks, ``ep_size=world``): the collectives
    ``CommDebugMode`` sees, and their bytes."""
    import transformers
    from transformers.distributed import DistributedConfig

    config = transformers.AutoConfig.for_model("mixtral", hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                                               num_key_value_heads=4, vocab_size=2048, num_local_experts=8, num_experts_per_tok=2)
    distributed, _, mesh = transformers.MixtralForCausalLM.prepare_distribute_model(DistributedConfig(fsdp_size=world, ep_size=world))
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM.maybe_distribute_model(transformers.MixtralForCausalLM(config), distributed, mesh)
    ids = torch.randint(0, 2048, (1, 512), generator=torch.Generator().manual_seed(rank))
    figures: dict[str, Any] = {"comm_debug": comm_debug_counts(lambda: model(input_ids=ids, labels=ids).loss.backward())[0]}
    model.zero_grad(set_to_none=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        figures["collectives"] = collectives(CommunicationAnalysis(model, (), {"input_ids": ids, "labels": ids}, backend="dispatch", backward=True))
    return figures


class GPTStage(nn.Module):
    """Stage ``index`` of ``stages`` of the small GPT, as torchtitan cuts a transformer: its share
    of the blocks, the embeddings on the first stage, the last norm and the head on the last (the
    parts other stages hold are dropped); a middle stage takes and gives hidden states."""

    def __init__(self, model: nn.Module, index: int, stages: int) -> None:
        super().__init__()
        blocks = list(model.model.layers)
        share = len(blocks) // stages
        model.model.layers = nn.ModuleList(blocks[index * share:(index + 1) * share])
        self.first, self.last = index == 0, index == stages - 1
        if not self.first:
            model.model.embed_tokens = None
        if not self.last:
            model.model.norm, model.lm_head = nn.Identity(), None
        self.gpt = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inputs = {"input_ids": x} if self.first else {"inputs_embeds": x}
        hidden = self.gpt.model(**inputs, use_cache=False).last_hidden_state
        return self.gpt.lm_head(hidden) if self.last else hidden


def pipelined_gpt(rank: int, world: int, micro_batch: int, micro_batches: int, replicas: int = 1,
                  virtual_stages: int = 1) -> tuple[nn.Module, Callable[[], None], list[Any]]:
    """The small GPT cut into ``world / replicas * virtual_stages`` pipeline stages under torch's
    1F1B schedule (its interleaved 1F1B where ``virtual_stages > 1``, the rank holding stages
    ``rank``, ``rank + world``, ...) over ``micro_batches`` micro-batches of ``micro_batch``
    sequences of 128 tokens, the loss the model's own; each stage held by ``replicas``
    data-parallel ranks under DDP (a stage's ranks adjacent: data parallelism inside the pipeline,
    Megatron's order), each replica on its own batch. The rank's stage (a ``ModuleList`` of its
    stages when interleaved), a training step's pipelined forward and backward, and torch's
    ``PipelineStage`` of each of its stages."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

    ranks = world // replicas
    stages = ranks * virtual_stages
    index, replica = divmod(rank, replicas)
    group = None
    if replicas > 1:
        mesh = init_device_mesh("cpu", (ranks, replicas), mesh_dim_names=("pp", "dp"))
        group = mesh["pp"].get_group()
    ids = torch.randint(0, 1024, (micro_batch * micro_batches, 128), generator=torch.Generator().manual_seed(replica))
    hidden = torch.zeros(micro_batch, 128, 256)
    accepted = inspect.signature(PipelineStage).parameters  # torch 2.11's stage takes no gradients' shapes
    modules, pipeline = [], []
    for held in range(index, stages, ranks):
        model = small_gpt()
        loss_function = model.loss_function
        stage_module = GPTStage(model, held, stages)
        runner = stage_module
        if replicas > 1:
            runner = nn.parallel.DistributedDataParallel(stage_module, process_group=mesh["dp"].get_group())
        inputs = ids[:micro_batch] if held == 0 else hidden
        outputs = torch.zeros(micro_batch, 128, 1024) if held == stages - 1 else hidden
        shapes = {"input_args": (inputs,), "output_args": (outputs,), "output_grads": (outputs,), "input_grads": (inputs,), "group": group}
        modules.append(stage_module)
        pipeline.append(PipelineStage(runner, held, stages, torch.device("cpu"), **{name: shape for name, shape in shapes.items() if name in accepted}))

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return loss_function(logits, labels, vocab_size=1024)
    schedule = Schedule1F1B(pipeline[0], micro_batches, loss) if virtual_stages == 1 else ScheduleInterleaved1F1B(pipeline, micro_batches, loss)

    def step() -> None:  # as a training loop runs it: the last stage's logits not kept for the caller
        if index == 0:
            schedule.step(ids, return_outputs=False)
        elif index == ranks - 1:
            schedule.step(target=ids, return_outputs=False)
        else:
            schedule.step(return_outputs=False)
    return (modules[0] if virtual_stages == 1 else nn.ModuleList(modules)), step, pipeline


def receive_buffers(*stages: Any) -> list[torch.Tensor]:
    """The buffers ``PipelineStage``s receive into (made at their first step, kept for every step):
    one per micro-batch for the activations each receives and one for the gradients."""
    infos = [info for stage in stages for chunk in (*stage.args_recv_info.values(), *stage.grad_recv_info.values()) for info in chunk]
    return [info.buffer for info in infos if isinstance(getattr(info, "buffer", None), torch.Tensor)]


def planned_pipeline(rank: int, world: int, micro_batches: int = 4, virtual_stages: int = 1) -> dict[str, Any]:
    """The small GPT's training step cut into ``world`` stages under 1F1B (``micro_batches`` of 2
    sequences; interleaved over ``virtual_stages`` a rank): each rank's sends and receives, and
    MemTracker's peak of its stages' step with AdamW (the least of 2 steady steps: gloo's thread may
    hold a buffer a little longer), the buffers the stages receive into taken in (made at the
    first step: MemTracker would see each only once the step writes it)."""
    stage_module, pipelined, stages = pipelined_gpt(rank, world, 2, micro_batches, virtual_stages=virtual_stages)
    optimizer = torch.optim.AdamW(stage_module.parameters())

    def step() -> None:
        pipelined()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    step()
    with record_collectives() as log:
        step()
    peak = min(memtracker_peak(step, stage_module, optimizer, *receive_buffers(*stages)) for _ in range(2))
    dist.barrier()  # the last sends complete before the process group goes
    return {"collectives": {key: [t.calls, t.bytes] for key, t in log.by_collective().items()}, "peak": peak}


def planned_pipeline_by_data_parallel(rank: int, world: int) -> dict[str, Any]:
    """MemTracker's peak of 3 training steps of the small GPT in 2 stages under torch's 1F1B (4
    micro-batches of 2 sequences), each stage held by ``world / 2`` ranks under DDP, the stages,
    DDP and AdamW made under the tracker: it sees DDP's buckets (made with the wrapper, as in
    :func:`_ddp_peak`) and the buffers the stages receive into (made at the first step)."""
    def steps() -> None:
        stage_module, pipelined, _ = pipelined_gpt(rank, world, 2, 4, replicas=world // 2)
        optimizer = torch.optim.AdamW(stage_module.parameters())
        for _ in range(3):
            pipelined()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    peak = memtracker_peak(steps)
    dist.barrier()  # the last sends complete before the process group goes
    return {"peak": peak}


def planned_pipeline_peaks(rank: int, world: int) -> dict[str, Any]:
    """MemTracker's peak of the rank's stage (:func:`planned_pipeline`) at as many micro-batches as
    stages (the first backward the only one with all in flight) and at twice as many."""
    return {str(micro_batches): planned_pipeline(rank, world, micro_batches)["peak"] for micro_batches in (world, 2 * world)}


def planned_interleaved_peaks(rank: int, world: int) -> dict[str, Any]:
    """MemTracker's peak of the rank's 2 stages under torch's interleaved 1F1B
    (:func:`planned_pipeline`) at as many, twice and four times as many micro-batches as ranks."""
    return {str(micro_batches): planned_pipeline(rank, world, micro_batches, virtual_stages=2)["peak"] for micro_batches in (world, 2 * world, 4 * world)}


CASES: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "transformers_expert_parallel": transformers_expert_parallel,
    "tensor_parallel": tensor_parallel,
    "data_parallel": data_parallel,
    "expert_parallel": expert_parallel,
    "pipeline": pipeline,
    "faults": faults,
    "read_on_rank_0": read_on_rank_0,
    "planned_layouts": planned_layouts,
    "planned_pipeline": planned_pipeline,
    "planned_pipeline_peaks": planned_pipeline_peaks,
    "planned_pipeline_by_data_parallel": planned_pipeline_by_data_parallel,
    "planned_interleaved_peaks": planned_interleaved_peaks,
}


def run_rank(rank: int, world: int, store: str, folder: str, case: str) -> None:
    faulthandler.enable(all_threads=True)  # a rank aborted by a C++ error shows where it was
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world)
    try:
        figures = CASES[case](rank, world)
        with open(f"{folder}/rank{rank}.json", "w") as stream:
            json.dump(figures, stream)
    except BaseException:
        dist.destroy_process_group()
        raise
    dist.destroy_process_group()
    # Done: leave without running C++ static destructors, where gloo's send/recv threads
    # sometimes abort a process at exit (seen with torch's pipelining under gloo)
    os._exit(0)


def first_line_matching(text: str, pattern: str) -> str:
    return next(line for line in text.splitlines() if re.search(pattern, line))
