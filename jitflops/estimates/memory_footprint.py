"""``memory_footprint``: the memory a model needs for inference or a training step, per module,
estimated without allocating it (where the forward reads no value); ``largest_fitting``: the largest batch or length that fits.

The step runs on a copy of the model made of fake tensors (``FakeTensorMode``) on the device the
model is on: a model on a GPU of this machine gets fake CUDA tensors, so that the step takes the
kernels CUDA would (SDPA's flash, memory-efficient or math kernel, by dtype and shape: a float32
grouped-query attention runs the math kernel there and holds its scores); any other model, the CPU's
kernels (attention's fused kernels included), and where torch's meta kernel refuses what a device's
kernel runs (a float32 grouped product of experts), one of jitflops' that accepts it. It runs under
:class:`~jitflops.estimates.memory_recorder.MemoryRecorder`. A training step is the forward, the backward
from the output's ``loss`` (else from the sum of its floating outputs), the output dropped, then
the optimizer's ``step`` and ``zero_grad``. The peak is a steady step's, not the first's (whose
optimizer state does not exist yet during its forward and backward): the state the step makes is
counted from before the forward on. Inference is the forward under ``no_grad`` in eval mode, its output kept.

A forward that reads a value (a vision encoder's patch grid, a CTC loss's label lengths) cannot run
on fake tensors: where the model has values, the step runs on a copy with them instead, under the
same recorder (it allocates and computes then, as torch's ``MemTracker`` does).

The user's model is never touched: the copy has its own parameters, buffers and hook tables.
"""

from __future__ import annotations

import itertools
from contextlib import ExitStack, nullcontext
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.utils import _pytree as pytree

from .devices import DeviceSpec, device_spec, is_cpu_spec
from ..frontends.dispatch_trace import loss_backward
from ..core.errors import TraceError
from .fake_sharding import TensorParallelPlan, fake_process_group, shard_like_fsdp2, shard_like_tensor_parallel
from .memory_estimate import (
    KVCache, MemoryEstimate, StepRecord, bytes_by_category, module_memory, peak_of, phase_at, unseen_saved,
)
from .memory_recorder import BACKWARD, FORWARD, OPTIMIZER, MemoryRecorder, MemoryRecording
from ..frontends.meta_values import (
    DEVICE_META_KERNELS, READS_A_FAKE_VALUE, empty_copy, holds_values, meta_kernels, reads_a_fake_value, valued_copy,
)
from ..core.model_io import ModelCall, generation_cache, tensor_leaves, tensors_inside
from .optimizers import OptimizerChoice, optimizer_factory

GPU_ROUNDING = 512
"""The CUDA caching allocator's block size: every allocation is rounded up to it."""


def _is_gpu(device: Optional[DeviceSpec]) -> bool:
    return device is not None and not is_cpu_spec(device)


def _fake_device(model: nn.Module, call: ModelCall, sharded: bool) -> str:
    """The device of the fake copy: the CUDA device the model's first weight (else input) is on,
    where this machine has CUDA; else, and for a sharded estimate (its fake mesh is the CPU's), the CPU."""
    first = next(itertools.chain(model.parameters(), model.buffers(), call.tensors()), None)
    if sharded or first is None or first.device.type != "cuda" or not torch.cuda.is_available():
        return "cpu"
    return str(first.device)


class _Step:
    """One estimated step: the fake copy, its recorder, and what each storage turned out to be."""

    def __init__(self, model: nn.Module, call: ModelCall, rounding: int) -> None:
        self.model = model
        self.call = call
        self.names = {module: name for name, module in model.named_modules(remove_duplicate=False)}
        self.recorder = MemoryRecorder(self.names, rounding)
        self.categories: dict[int, str] = {}
        self.owners: dict[int, str] = {}

    def claim(self, tensor: Optional[torch.Tensor], category: str, owner: Optional[str] = None) -> Optional[int]:
        """Note ``tensor``'s storage as of ``category`` (owned by module ``owner``), unless it is
        claimed already; its life's index (None for no tensor)."""
        index = self.recorder.track(tensor)
        if index is not None and index not in self.categories:
            self.categories[index] = category
            if owner is not None:
                self.owners[index] = owner
        return index

    @property
    def recording(self) -> MemoryRecording:
        return self.recorder.recording


def memory_footprint(
    model: nn.Module,
    inputs: Any,
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    train: Optional[OptimizerChoice] = None,
    dtype: Optional[torch.dtype] = None,
    autocast: Optional[torch.dtype] = None,
    master_weights: bool = False,
    checkpointing: bool = False,
    fsdp: Optional[int] = None,
    fsdp_units: Optional[Sequence[type]] = None,
    tensor_parallel: Optional[int] = None,
    tp_plan: Optional[TensorParallelPlan] = None,
    device: Union[None, str, DeviceSpec] = None,
    kv_cache_length: Optional[int] = None,
    compute: bool = True,
) -> MemoryEstimate:
    """The memory ``model`` needs to run on ``inputs`` (fvcore's ``inputs``: a tuple of positional
    arguments, a mapping of keyword arguments, or one tensor).

    - ``train``: an optimizer (a name: sgd, sgd-momentum, adam, adamw, adafactor, adam8bit; an
      ``Optimizer`` class; a function of the parameters) for a training step; None: inference.
    - ``dtype``: the parameters' (and floating inputs') dtype, e.g. ``torch.bfloat16``;
      ``master_weights``: the optimizer steps float32 copies of them (mixed precision's master
      weights, counted with the optimizer's state); ``autocast``: the forward under autocast.
    - ``checkpointing``: activation checkpointing, by the model's own
      ``activation_checkpointing_enable()`` (``gradient_checkpointing_enable()`` before transformers
      5.24); a model that checkpoints with
      ``torch.utils.checkpoint`` itself needs nothing.
    - ``fsdp``: the ranks FSDP2 shards over (one rank's memory is estimated, ``inputs`` being its
      own batch); ``fsdp_units``: the block classes to shard (default: the model's
      ``_no_split_modules``).
    - ``tensor_parallel``: the ranks tensor parallelism shards over (one rank's memory; the inputs
      are every rank's); ``tp_plan``: module names to torch ``ParallelStyle`` s or ``"colwise"``,
      ``"rowwise"``, ``"colwise_gather_output"`` (default: a transformers model's own plan).
      With ``fsdp`` too, one rank of a 2-D mesh: ``fsdp`` data-parallel by ``tensor_parallel`` ranks
      (``fully_shard`` over the first dimension of a model parallelized over the second, as
      torchtitan does); the inputs are the rank's data-parallel batch.
    - ``device``: the device the step would run on (a name of the device table or a spec): a GPU
      rounds allocations as the CUDA caching allocator does and steps torch's optimizers with their
      multi-tensor (``foreach``) implementation, as torch does by default there (the for-loop
      one where the parameters mix DTensors and plain tensors: torch's foreach step raises on
      those, :func:`~jitflops.estimates.optimizers.mixes_dtensors`). A model on a GPU
      of this machine is estimated as on that GPU, with CUDA's kernels, whatever ``device`` says.
    - ``kv_cache_length``: with inference, the generation length the KV cache is grown to (its
      bytes per token are read from the output's ``past_key_values``).
    - ``compute``: where the forward reads a value (``.item()``, a size set by a tensor's values:
      a vision encoder's patch grid, a CTC loss's label lengths), which fake tensors do not have,
      and the model and inputs have values (none on meta, no sharding asked), the step runs on a
      copy of the model with its values, under the same accounting: real memory and time, the
      model's memory twice (``settings["computed"]`` says so). False: raise instead.
    """
    spec = device_spec(device) if device is not None else None
    call = ModelCall.from_user(inputs, kwargs)
    fake_device = _fake_device(model, call, sharded=fsdp is not None or tensor_parallel is not None)
    gpu = _is_gpu(spec) or fake_device != "cpu"
    rounding = GPU_ROUNDING if gpu else 1
    factory = optimizer_factory(train, foreach=gpu) if train is not None else None
    if checkpointing and not _checkpointing_switch(model):
        raise ValueError(f"{type(model).__name__} has no activation_checkpointing_enable() or gradient_checkpointing_enable(): wrap its blocks in torch.utils.checkpoint instead of checkpointing=True")
    if checkpointing and train is None:
        raise ValueError("checkpointing=True applies to training: give train=<optimizer>")
    if kv_cache_length is not None and train is not None:
        raise ValueError("kv_cache_length applies to inference (generation): leave train unset")
    settings = {"dtype": dtype, "autocast": autocast, "master_weights": master_weights, "checkpointing": checkpointing, "fsdp": fsdp,
                "tensor_parallel": tensor_parallel, "device": spec.name if spec else None, "batch": _batch(call)}

    def recorded(values: bool) -> tuple[_Step, Optional[KVCache]]:
        """The step on a copy of the model: of fake tensors, or with ``values`` its values'."""
        with ExitStack() as stack:
            if values:
                twin, twin_call = valued_copy(model, call)
            else:
                fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
                twin, twin_call, _ = empty_copy(model, call, fake_device, fake_mode)
            if fsdp is not None and tensor_parallel is not None:
                mesh = stack.enter_context(fake_process_group(fsdp * tensor_parallel, tensor_parallel))
                data_mesh, model_mesh = mesh["dp"], mesh["tp"]
            elif fsdp is not None or tensor_parallel is not None:
                data_mesh = model_mesh = stack.enter_context(fake_process_group(fsdp or tensor_parallel))
            if not values:
                stack.enter_context(fake_mode)
                stack.enter_context(meta_kernels(DEVICE_META_KERNELS))
            if dtype is not None:
                _cast_weights(twin, dtype)
                twin_call = _cast_floating(twin_call, dtype)
            twin.train(train is not None)
            if checkpointing:
                getattr(twin, _checkpointing_switch(twin))()
            # outside the fake mode, the copy's tensors still dispatch to it, while a mesh's rank map (a
            # real integer tensor, which FSDP2 on a 2-D mesh indexes to concatenate its meshes) stays real
            with unset_fake_temporarily():
                if tensor_parallel is not None:
                    shard_like_tensor_parallel(twin, model_mesh, tp_plan)
                if fsdp is not None:
                    shard_like_fsdp2(twin, data_mesh, fsdp_units)
            step = _Step(twin, twin_call, rounding)
            try:
                output = _run(step, factory, autocast, master_weights, torch.device(fake_device).type)
            except Exception as error:
                raise _named_error(step, error) from error
            return step, _kv_cache(output, call, kv_cache_length) if kv_cache_length is not None else None

    try:
        step, kv_cache = recorded(values=False)
    except TraceError as error:
        unsharded = fsdp is None and tensor_parallel is None
        if not (compute and unsharded and reads_a_fake_value(error.__cause__) and holds_values(model, call)):
            raise
        step, kv_cache = recorded(values=True)
        settings["computed"] = "on the model's values, which its forward reads"
    recording = step.recording
    since = recording.phase_starts[FORWARD]
    peak, tick = peak_of(recording, since)
    forward_end = recording.phase_starts.get(BACKWARD, recording.ticks)
    unseen = unseen_saved(recording, step.categories, forward_end)
    modules = module_memory(step.names.values(), step.owners, step.categories, recording, unseen)
    optimizer_name = train if isinstance(train, str) or train is None else getattr(train, "__name__", type(train).__name__)
    return MemoryEstimate(
        mode="training" if train is not None else "inference",
        peak=peak,
        peak_phase=phase_at(recording, tick),
        at_peak=bytes_by_category(recording, step.categories, tick),
        modules={name: modules[name] for name in dict.fromkeys(step.names.values())},
        optimizer=optimizer_name,
        settings=settings,
        kv_cache=kv_cache,
        rounding=rounding,
        step=StepRecord(recording, step.categories, step.owners),
    )


def _checkpointing_switch(model: nn.Module) -> str:
    """The name of the model's method that turns activation checkpointing on ("" for none): transformers'
    ``activation_checkpointing_enable``, ``gradient_checkpointing_enable`` before 5.24."""
    return next((name for name in ("activation_checkpointing_enable", "gradient_checkpointing_enable") if hasattr(model, name)), "")


def _batch(call: ModelCall) -> Optional[int]:
    tensors = [t for t in call.tensors() if t.dim()]
    return tensors[0].shape[0] if tensors else None


def _cast_weights(model: nn.Module, dtype: torch.dtype) -> None:
    """The floating parameters and buffers of ``model`` (a fake copy: ``Module.to`` cannot swap fake
    parameters) made ``dtype``, tied ones staying tied."""
    cast: dict[int, torch.Tensor] = {}

    def converted(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in cast:
            value = tensor.detach().to(dtype) if tensor.is_floating_point() else tensor
            cast[id(tensor)] = nn.Parameter(value, requires_grad=tensor.requires_grad) if isinstance(tensor, nn.Parameter) and value is not tensor else value
        return cast[id(tensor)]

    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is not None:
                    table[name] = converted(tensor)


def _cast_floating(call: ModelCall, dtype: torch.dtype) -> ModelCall:
    args, kwargs = pytree.tree_map_only(torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t, (call.args, call.kwargs))
    return ModelCall(args, kwargs)


def _named_error(step: _Step, error: BaseException) -> TraceError:
    module = step.recorder.failed_module(error)
    failed = step.model.get_submodule(module) if module else step.model
    named = TraceError(module, type(failed).__name__, error, "estimating memory")
    if reads_a_fake_value(error):
        named.add_note(READS_A_FAKE_VALUE)
    return named


def _run(step: _Step, factory: Optional[Callable[..., torch.optim.Optimizer]], autocast: Optional[torch.dtype], master_weights: bool,
         device_type: str) -> Any:
    """The step under the recorder; every storage that is a parameter, buffer, input, gradient,
    optimizer state or output is claimed as such (the rest are temporaries or saved activations).
    ``device_type``: the fake copy's, which autocast is for."""
    model, recorder = step.model, step.recorder
    owners: dict[int, str] = {}
    """Each parameter (by id) -> the module it is counted in: the first that holds it, for a tied
    weight as for its storage, so that its gradient and state are counted beside it."""
    with recorder:
        for name, module in model.named_modules():
            for p in module.parameters(recurse=False):
                owners.setdefault(id(p), name)
                step.claim(p, "parameters", name)
            for b in module.buffers(recurse=False):
                step.claim(b, "buffers", name)
        for tensor in step.call.tensors():
            step.claim(tensor, "inputs")
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer, masters = _optimizer(step, factory, trainable, master_weights, owners) if factory is not None else (None, {})
        autocasting = torch.autocast(device_type, dtype=autocast) if autocast is not None else nullcontext()
        with recorder.phase(FORWARD), torch.set_grad_enabled(optimizer is not None), autocasting:
            output = step.call.run(model)
        _claim_all(step, tensor_leaves(output) + tuple(tensors_inside(generation_cache(output))), "outputs")
        for index in recorder.recording.saved:
            step.categories.setdefault(index, "saved_activations")
        if optimizer is None:
            return output
        with recorder.phase(BACKWARD):
            loss_backward(output)
            del output
        for p in trainable:
            step.claim(p.grad, "gradients", owners[id(p)])
        with recorder.phase(OPTIMIZER):
            _step_optimizer(optimizer, trainable, masters)
        _claim_state(step, optimizer, trainable, masters, owners)
    return None


def _claim_all(step: _Step, tensors: Sequence[torch.Tensor], category: str) -> None:
    """(A function of its own, so that no loop variable keeps the last tensor alive.)"""
    for tensor in tensors:
        step.claim(tensor, category)


def _optimizer(step: _Step, factory: Callable[..., torch.optim.Optimizer], trainable: list[torch.Tensor], master_weights: bool,
               owners: Mapping[int, str]) -> tuple[torch.optim.Optimizer, dict[int, torch.Tensor]]:
    """The optimizer, and the float32 master copy of each trainable parameter where ``master_weights``."""
    masters = {id(p): nn.Parameter(p.detach().float()) for p in trainable} if master_weights else {}
    for p in trainable:
        step.claim(masters.get(id(p)), "optimizer_state", owners[id(p)])
    return factory([masters[id(p)] for p in trainable] if master_weights else trainable), masters


def _claim_state(step: _Step, optimizer: torch.optim.Optimizer, trainable: list[torch.Tensor], masters: Mapping[int, torch.Tensor],
                 owners: Mapping[int, str]) -> None:
    """The optimizer's state, made by this (first) step, claimed and dated back to before the
    forward: in a steady step it exists throughout (the same as running a first step before the
    recorded one, at half the cost)."""
    before_forward = step.recording.phase_starts[FORWARD] - 1
    for p in trainable:
        for value in optimizer.state.get(masters.get(id(p), p), {}).values():
            if isinstance(value, torch.Tensor):
                step.recording.lives[step.claim(value, "optimizer_state", owners[id(p)])].born = before_forward


def _step_optimizer(optimizer: torch.optim.Optimizer, trainable: list[torch.Tensor], masters: Mapping[int, torch.Tensor]) -> None:
    """``step`` and ``zero_grad``; with master weights, each gradient is moved to its float32 copy
    first and the updated copy written back into the parameter."""
    for p in trainable:
        if id(p) in masters and p.grad is not None:
            masters[id(p)].grad = p.grad.float()
            p.grad = None
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        for p in trainable:
            if id(p) in masters:
                p.copy_(masters[id(p)])


def _kv_cache(output: Any, call: ModelCall, length: int) -> KVCache:
    cache = generation_cache(output)
    tensors = {id(t.untyped_storage()): t for t in tensors_inside(cache, depth=4)} if cache is not None else {}
    ids = next((t for t in call.tensors() if not t.is_floating_point() and t.dim() == 2), None)
    if not tensors or ids is None:
        raise ValueError("kv_cache_length: the model returned no past_key_values for token ids of shape (batch, length): run it with use_cache=True, "
                         "as a decoder (an encoder as a causal language model, BERT's or RoBERTa's, returns none without config.is_decoder=True)")
    batch, prompt = ids.shape
    nbytes = sum(t.untyped_storage().nbytes() for t in tensors.values())
    return KVCache(nbytes // (batch * prompt), batch, prompt, length)


def largest_fitting(
    model: nn.Module,
    inputs_of: Callable[[int], Any],
    memory: Union[int, str, DeviceSpec],
    *,
    kwargs_of: Optional[Callable[[int], Mapping[str, Any]]] = None,
    low: int = 1,
    high: int = 1 << 20,
    **options: Any,
) -> tuple[int, Optional[MemoryEstimate]]:
    """The largest ``n`` in ``[low, high]`` whose ``memory_footprint(model, inputs_of(n), **options)``
    fits in ``memory`` (bytes or a device), and its estimate; ``(low - 1, None)`` when ``low`` does
    not fit. ``inputs_of`` makes the inputs (``kwargs_of`` the keyword arguments) for a batch size
    or a sequence length ``n``: the footprint grows with it, so sizes are doubled, then bisected, each
    on fake tensors alone (``compute=False``: the sizes tried outgrow what this machine holds)."""
    if low < 1 or high < low:
        raise ValueError(f"need 1 <= low <= high, got low={low}, high={high}")
    estimates: dict[int, MemoryEstimate] = {}

    def fits(n: int) -> bool:
        estimates[n] = memory_footprint(model, inputs_of(n), kwargs_of(n) if kwargs_of else None, **{**options, "compute": False})
        return estimates[n].fits(memory)

    if not fits(low):
        return low - 1, None
    good, bad = low, None  # the largest size known to fit, the smallest known not to
    while bad is None and good < high:
        trial = min(good * 2, high)
        good, bad = (trial, None) if fits(trial) else (good, trial)
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if fits(middle) else (good, middle)
    return good, estimates[good]
