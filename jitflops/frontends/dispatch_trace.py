"""The dispatch front end: record the aten ops a model actually runs, forward and backward.

A ``TorchDispatchMode`` sees every aten op that reaches the dispatcher, after autograd, so it
follows data-dependent control flow, ``torch.compile``d models (their compiled kernels run as aten
ops in eager fallback and are seen as such) and any output type, and it sees the backward pass.
Torch's ``ModuleTracker`` says which modules are running, in the forward and, through autograd
hooks, in the backward, where an op belongs to the modules whose forward created the gradient it
computes. Each op becomes an :class:`~jitflops.core.records.EagerOpRecord` read by the same handles as
the JIT's records. The gradient hooks are set only where a backward is recorded, and only on
tensors autograd can hook (:class:`_ScopeTracker`).

A few composite ops decompose, below autograd, into ops that cost something else under the
counting convention: an adaptive average pool to one output becomes a ``mean``, an RMS norm
elementwise steps, an FFT kernels that depend on the input's dtype. Those
(:data:`FUNCTION_LEVEL_KINDS`) are recorded one level up, where Python calls them (a
``TorchFunctionMode``), as the JIT records them, and what they decompose into is not recorded again.

Since every op passes through the recorder before it runs, the model's snapshot copies nothing up
front: the recorder hands it each tensor an op is about to write (what the op's schema marks
``Tensor(a!)``, and the running statistics of :data:`UNDECLARED_WRITES`), and the snapshot copies
it if it is the model's (:meth:`~jitflops.core.model_guard.ModelSnapshot.save_before_write`).
"""

from __future__ import annotations

import functools
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.nn.parameter import UninitializedTensorMixin
from torch.overrides import TorchFunctionMode
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves
from torch.utils.module_tracker import ModuleTracker

from ..core.errors import TraceError
from .bytecode_count import BytecodeCounter
from .flex_attention_ops import FLEX_ATTENTION_ARGUMENTS, FLEX_ATTENTION_KIND, flex_attention_uncompiled, register_flex_attention
from ..handles.attention import SOFTMAX_KINDS
from ..handles.spectral import FFT_KINDS
from .masked_scores import MaskedScorePairing
from .storage_spans import StorageSpan, StorageSpans
from .meta_values import DEVICE_META_KERNELS, READS_A_FAKE_VALUE, READS_A_VALUE, holds_meta, meta_kernels, reads_a_fake_value, reads_a_meta_value
from .traced_path import on_the_traced_path
from .value_checks import ValueChecks
from ..core.model_guard import own_cycles_collected, preserved
from ..core.model_io import ModelCall, tensor_leaves
from ..core.process_groups import dispatches_to_dtensor, process_group_meta
from ..core.records import BACKWARD, FORWARD, RECOMPUTE, EagerOpRecord, OpRecord, TensorMeta

BackwardFn = Callable[[Any], None]
"""Runs the backward pass from the model's output (by default: the sum of its float tensors)."""


def _decode(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if isinstance(value, UninitializedTensorMixin):  # a lazy module's parameter, before it materialises
            return TensorMeta(None, value.dtype)
        local = getattr(value, "_local_tensor", None)  # a DTensor: this rank works on its shard
        tensor = value if local is None else local  # strides as the device lays it out: a fake tensor's, not a meta kernel's
        strides = tuple(tensor.stride()) if tensor.layout == torch.strided and tensor.device.type != "meta" else None
        return TensorMeta(tuple(tensor.shape), value.dtype, strides=strides)
    if isinstance(value, torch.ScriptObject) and value._has_method("unpack"):
        weight = value.unpack()[0]  # a quantized layer's packed weights: the weight they hold
        return TensorMeta(tuple(weight.shape), weight.dtype)
    if isinstance(value, (list, tuple)):
        return [_decode(item) for item in value]
    return value


UNDECLARED_WRITES: dict[str, Optional[str]] = {
    "aten::native_batch_norm": "training",
    "aten::cudnn_batch_norm": "training",
    "aten::miopen_batch_norm": "training",
    "aten::batch_norm_gather_stats": None,
    "aten::batch_norm_gather_stats_with_counts": None,
}
"""Ops that write their ``running_mean`` and ``running_var`` though their schemas do not say so
(torch's older batch norm kernels; ``_native_batch_norm_legit`` replaced them with a schema that
does), each with the flag that says whether a call writes them (None: always)."""


def _attention_mask(mask: torch.Tensor) -> TensorMeta:
    """An attention mask (or a softmax's input: eager attention's masked scores) with the number
    of entries that let attention through: True in a boolean mask, above half the dtype's lowest
    value in an additive one (masked entries hold -inf or the dtype's minimum, as Hugging Face's
    masks do, and so do scores once such a mask is added). Fake and meta masks hold no values."""
    meta = _decode(mask)
    if isinstance(mask, FakeTensor) or mask.device.type == "meta":
        return meta
    kept = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    return TensorMeta(meta.shape, meta.dtype, int(kept.count_nonzero()))


_GROUP_ARGUMENTS = ("process_group", "group_name")
"""How collectives' schemas name their process group (``c10d::`` ops, functional collectives)."""


@dataclass(frozen=True)
class Signature:
    """What an op's schema says of its arguments, read once per op: a schema's arguments are
    pybind11 objects, a few microseconds to read on every call."""

    name: str
    names: tuple[str, ...]
    defaults: tuple[Any, ...]
    """Each argument's default, decoded; None where it has none."""
    written: tuple[int, ...]
    """The arguments the op writes: ``Tensor(a!)`` (in place, ``out=``), and those of :data:`UNDECLARED_WRITES`."""
    written_if: Optional[int]
    """The flag argument without which :attr:`written` are not written, if any."""
    group: Optional[int]
    """A collective's process group argument, recorded as a :class:`~jitflops.core.process_groups.ProcessGroupMeta`."""
    mask: Optional[int]
    """An attention op's mask argument, or a softmax's input, recorded with how many entries it
    keeps (:func:`_attention_mask`)."""

    @classmethod
    def of(cls, schema: Any) -> "Signature":
        arguments = schema.arguments
        names = tuple(argument.name for argument in arguments)
        undeclared = schema.name in UNDECLARED_WRITES
        flag = UNDECLARED_WRITES.get(schema.name)
        return cls(
            schema.name,
            names,
            tuple(_decode(argument.default_value) if argument.has_default_value() else None for argument in arguments),
            tuple(
                index for index, argument in enumerate(arguments)
                if (argument.alias_info is not None and argument.alias_info.is_write) or (undeclared and argument.name in ("running_mean", "running_var"))
            ),
            names.index(flag) if flag is not None else None,
            next((index for index, name in enumerate(names) if name in _GROUP_ARGUMENTS), None),
            names.index("attn_mask") if "attn_mask" in names else (0 if schema.name in SOFTMAX_KINDS else None),
        )

    def _argument(self, index: int, args: tuple, kwargs: dict) -> Any:
        return args[index] if index < len(args) else kwargs.get(self.names[index], self.defaults[index])

    def values(self, args: tuple, kwargs: dict) -> list[Any]:
        """Positional and keyword arguments in schema order, decoded, defaults filled in."""
        values = [_decode(value) for value in args]
        for name, default in zip(self.names[len(args):], self.defaults[len(args):]):
            values.append(_decode(kwargs[name]) if name in kwargs else default)
        if self.group is not None:
            values[self.group] = process_group_meta(values[self.group])
        if self.mask is not None:
            mask = args[self.mask] if self.mask < len(args) else kwargs.get(self.names[self.mask])
            if isinstance(mask, torch.Tensor):
                values[self.mask] = _attention_mask(mask)
        return values

    def record(self, args: tuple, kwargs: dict, output: Any, module: str, phase: str) -> EagerOpRecord:
        """One call of the op as a record, in ``module``'s scope."""
        outputs = [_decode(value) for value in (output if isinstance(output, (list, tuple)) else (output,))]
        return EagerOpRecord(self.name, self.values(args, kwargs), outputs, self.names, module, phase)

    def written_tensors(self, args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
        """The tensors this call of the op writes."""
        if self.written_if is not None and not self._argument(self.written_if, args, kwargs):
            return
        for index in self.written:
            value = self._argument(index, args, kwargs)
            yield from (tensor for tensor in (value if isinstance(value, (list, tuple)) else (value,)) if isinstance(tensor, torch.Tensor))


FUNCTION_LEVEL_KINDS: tuple[str, ...] = (
    "aten::adaptive_avg_pool1d", "aten::adaptive_avg_pool2d", "aten::adaptive_avg_pool3d",  # become a mean
    "aten::rms_norm",  # becomes pow, mean, rsqrt and mul
    "aten::outer", "aten::ger", "aten::linalg_vecdot",  # become mul (and sum)
    # Under a dispatch mode torch computes singular or eigen vectors it would not compute without one
    # (its gradient check treats every tensor as a possible subclass): recorded as called instead.
    "aten::linalg_svdvals", "aten::linalg_eigvalsh", "aten::linalg_eigvals", "aten::linalg_matrix_rank",
    "aten::linalg_cond", "aten::linalg_matrix_norm", "aten::linalg_norm",
    *FFT_KINDS,  # become _fft_r2c/_fft_c2c/_fft_c2r kernels, which ones depending on the input dtype
)
"""Composite ops recorded where Python calls them, as the JIT records them: what they decompose
into below autograd would be counted otherwise under the counting convention."""


def _python_entry_points(kind: str) -> list[Callable[..., Any]]:
    """The Python callables through which ``kind`` is called: ``torch.x``, ``Tensor.x``,
    ``torch.nn.functional.x``, ``torch._C._nn.x``, ``torch.linalg.y`` for ``linalg_y`` and
    ``torch.fft.y`` for ``fft_y``."""
    name = kind.removeprefix("aten::")
    places: list[tuple[Any, str]] = [(torch, name), (torch.Tensor, name), (F, name), (torch._C._nn, name)]
    for prefix, namespace in (("linalg_", torch.linalg), ("fft_", torch.fft)):
        if name.startswith(prefix):
            places.append((namespace, name.removeprefix(prefix)))
    return [getattr(namespace, attribute) for namespace, attribute in places if hasattr(namespace, attribute)]


FUNCTION_LEVEL_OPS: dict[Callable[..., Any], str] = {
    function: kind for kind in FUNCTION_LEVEL_KINDS for function in _python_entry_points(kind)
}


def _flash_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor], dropout_p: float,
                     is_causal: bool, scale: Optional[float]) -> torch.Tensor:
    """The CPU's flash kernel, one op forward and one backward: its meta kernels exist."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


def _memory_efficient_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor], dropout_p: float,
                                is_causal: bool, scale: Optional[float]) -> torch.Tensor:
    """A GPU's memory-efficient kernel, one op forward and one backward (its meta kernels exist): a
    boolean mask is its additive bias."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill_(attn_mask.logical_not(), float("-inf"))
    if attn_mask is not None:
        attn_mask = attn_mask.expand(*query.shape[:-1], key.shape[-2])
    return torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, query.requires_grad, dropout_p, is_causal, scale=scale)[0]


def _the_cpu_takes_its_flash_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor],
                                    dropout_p: float, is_causal: bool, scale: Optional[float], enable_gqa: bool) -> bool:
    """Whether a CPU runs this call by its flash kernel: torch's own choice (``torch._fused_sdp_choice``),
    asked of stand-ins on the CPU with the same sizes, dtypes and gradient flags, one row each,
    expanded. Meta and fake tensors have a choice of their own, the math path. The CPU takes the math
    path for attention that drops out and for a mask that needs a gradient (T5's learned position bias)."""
    with _disable_current_modes():
        stand_ins = [
            None if tensor is None else torch.empty(tensor.shape[-1], dtype=tensor.dtype, requires_grad=tensor.requires_grad).expand(tensor.shape)
            for tensor in (query, key, value, attn_mask)
        ]
        choice = torch._fused_sdp_choice(*stand_ins, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    return choice == SDPBackend.FLASH_ATTENTION.value


def _attention_by_its_fused_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                                   dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None, enable_gqa: bool = False) -> torch.Tensor:
    """``scaled_dot_product_attention`` on meta or fake tensors as a CPU runs it: by its flash kernel,
    one op forward and one backward, where a CPU would choose that kernel
    (:func:`_the_cpu_takes_its_flash_kernel`); else by the math path, products, a softmax and their
    backward over the whole score matrix, which meta tensors take for every call."""
    if _the_cpu_takes_its_flash_kernel(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        return _flash_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)
    return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def _attention_by_a_gpus_fused_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                                      dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None, enable_gqa: bool = False) -> torch.Tensor:
    """``scaled_dot_product_attention`` as a GPU runs it: one fused kernel each way, grouped queries
    and dropout too (FlashAttention's and cuDNN's take them), run here by the CPU's flash kernel once
    the keys' and values' heads are repeated (a step the whole call's record leaves out); values of a
    width of their own (DeepSeek's latent attention: queries and keys of 192, values of 128), which
    flash kernels refuse, by the memory-efficient kernel, as CUDA picks it. A mask that needs a
    gradient keeps the math path."""
    if attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled():
        return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        groups = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(groups, dim=-3), value.repeat_interleave(groups, dim=-3)
    if value.shape[-1] != query.shape[-1]:
        return _memory_efficient_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)
    return _flash_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)


WHOLE_CALLS = ("aten::scaled_dot_product_attention",)
"""What a recording keeps whole where meta and fake tensors would take a call's math path: attention
runs as one fused kernel on a device; there, products, a softmax and masks. A time's recording keeps
it whole, and so does a count of a model on the meta device."""

AS_ITS_FUSED_KERNEL: dict[str, Callable[..., Any]] = {"aten::scaled_dot_product_attention": _attention_by_its_fused_kernel}
"""What a whole call runs on meta or fake tensors instead of its math decomposition (``whole``)."""
AS_A_GPUS_FUSED_KERNEL: dict[str, Callable[..., Any]] = {"aten::scaled_dot_product_attention": _attention_by_a_gpus_fused_kernel}
"""The same, where a GPU's kernels fuse more than a CPU's (``whole_as_on_a_gpu``)."""


@functools.lru_cache(maxsize=None)
def _signature_for(kind: str, arity: int) -> Signature:
    """The signature of the first overload of ``kind`` that takes ``arity`` arguments (not an ``out=`` one)."""
    return Signature.of(next(s for s in torch._C._jit_get_schemas_for_operator(kind) if len(s.arguments) >= arity and "out" not in s.overload_name))


def _hookable(tensor: Any) -> bool:
    """Whether autograd can hook the gradient of ``tensor``: it requires one and has a gradient
    function, or is a dense leaf. A view of a parameter made under ``no_grad`` (a class token
    ``expand``ed for the batch) requires grad but has neither; a sparse leaf has no dense view to hook."""
    return (
        isinstance(tensor, torch.Tensor) and tensor.requires_grad
        and (tensor.grad_fn is not None or (tensor.is_leaf and not tensor._is_view() and tensor.layout == torch.strided))
    )


class _ScopeTracker(ModuleTracker):
    """Torch's ``ModuleTracker``, with gradient hooks only where they are needed and possible.

    The tracker hooks the gradients of each module's inputs and outputs to know which module a
    backward op belongs to. A forward-only recording sets none (``backward=False``): scopes there
    come from the forward hooks alone. With a backward, tensors autograd cannot hook
    (:func:`_hookable`) are left out, where the tracker itself would assert.
    """

    def __init__(self, backward: bool) -> None:
        super().__init__()
        self.backward = backward
        self.forwards_running = 0
        """Module forwards running now: in the backward pass, those of activation checkpointing's recompute."""
        self._closing_after_own_hooks: dict[nn.Module, list[Any]] = {}
        """Modules whose scope closes after their own forward hooks, with the hook that closes it
        (one per call running: a module can run inside itself)."""
        self._raised: Optional[tuple[BaseException, frozenset[str]]] = None
        """The last exception that left a module's forward, and the modules running where it was raised."""

    def _gradient_hook_targets(self, values: Any) -> list[torch.Tensor]:
        return [value for value in tree_leaves(values) if _hookable(value)] if self.backward else []

    def __enter__(self) -> "_ScopeTracker":
        # The forward hook is always called, also when the forward raises: activation checkpointing
        # stops its recompute with an exception once it has the activations the backward needs.
        self._fw_pre_handle = register_module_forward_pre_hook(self._fw_pre_hook)
        self._fw_post_handle = register_module_forward_hook(self._fw_post_hook, always_call=True)
        return self

    def __exit__(self, *args: Any) -> None:
        super().__exit__(*args)
        for handles in self._closing_after_own_hooks.values():  # left where a forward hook raised
            for handle in handles:
                handle.remove()
        self._closing_after_own_hooks.clear()

    def _fw_pre_hook(self, mod: nn.Module, input: Any) -> None:
        self.forwards_running += 1
        super()._fw_pre_hook(mod, self._gradient_hook_targets(input))
        if mod._forward_hooks:
            # The module's own forward hooks are part of its call (tensor parallelism redistributes
            # a module's output in one): its scope closes after them, in a hook of its own that
            # runs last, as CommDebugMode's tracker does. Global hooks, this tracker's, run first.
            self._closing_after_own_hooks.setdefault(mod, []).append(mod.register_forward_hook(self._own_hooks_done, always_call=True))

    def _own_hooks_done(self, mod: nn.Module, input: Any, output: Any) -> None:
        handles = self._closing_after_own_hooks[mod]
        handles.pop().remove()
        if not handles:
            del self._closing_after_own_hooks[mod]
        self._close(mod, input, output)

    def _fw_post_hook(self, mod: nn.Module, input: Any, output: Any) -> None:
        if mod not in self._closing_after_own_hooks:
            self._close(mod, input, output)

    def _close(self, mod: nn.Module, input: Any, output: Any) -> None:
        self.forwards_running -= 1
        unwinding = sys.exc_info()[1]  # the hook is called while a forward's exception is handled
        if unwinding is not None and (self._raised is None or self._raised[0] is not unwinding):
            self._raised = (unwinding, frozenset(self.parents))
        super()._fw_post_hook(mod, input, self._gradient_hook_targets(output))

    def running_when(self, error: BaseException) -> set[str]:
        """The modules that were running when ``error`` was raised in a forward (the always-called
        forward hooks have closed their scopes since), or those running now."""
        return set(self._raised[1]) if self._raised is not None and self._raised[0] is error else set(self.parents)

    @property
    def phase(self) -> str:
        """The phase an op runs in now. An op of the backward pass that runs inside a module's forward
        belongs to activation checkpointing's recompute (``torch.utils.checkpoint``, either variant,
        runs the checkpointed modules' forwards again while the backward needs their activations)."""
        if not self.is_bw:
            return FORWARD
        return RECOMPUTE if self.forwards_running else BACKWARD


def _outermost_first(tracker_name: str) -> tuple[int, str]:
    return tracker_name.count("."), tracker_name


class _OpRecorder(TorchDispatchMode):
    """Records every aten op that runs, as this rank runs it.

    A DTensor op is left to DTensor (``NotImplemented``, as ``CommDebugMode`` does), which runs it
    on its local shards and redistributes with collectives: those come back here and are recorded,
    so a sharded model is counted per rank. What DTensor runs on fake tensors to propagate
    shardings is not work, and is not recorded (unless the model itself runs on fake tensors).
    """

    def __init__(self, tracker: _ScopeTracker, module_names: Mapping[str, str], before_write: Callable[[torch.Tensor], None], fake_ops_are_work: bool = False,
                 bytecode: Optional[BytecodeCounter] = None, storages: Optional[StorageSpans] = None) -> None:
        super().__init__()
        self.tracker = tracker
        self.bytecode = bytecode
        """Counts the model's Python bytecode between ops (:attr:`EagerOpRecord.bytecode`), where asked."""
        self.module_names = module_names
        """The canonical name of each module, under the name the tracker gives it (the root has none)."""
        self.before_write = before_write
        """Called with each tensor an op is about to write (the model's snapshot copies it if it is the model's)."""
        self.records: list[tuple[str, EagerOpRecord]] = []
        """Each op with its full scope path (``"/a/a.b"``); the record's own scope is the innermost module."""
        self.inside_function_level_op = 0
        self.inside_fake_op = 0
        self.fake_ops_are_work = fake_ops_are_work
        """Whether ops on fake tensors are the model's (it runs on them: a count in symbolic sizes),
        not DTensor's sharding propagation."""
        self.ran_collectives = False
        self.dtensor_ops = 0
        """DTensor ops left to DTensor since the last op recorded (:attr:`EagerOpRecord.dtensor_ops`)."""
        self.python_calls = 0
        """Torch calls Python has made so far (:class:`_FunctionLevelRecorder` counts them)."""
        self._call_with_an_op = -1
        self.masked_scores = MaskedScorePairing(self.records)
        self.storages = storages
        """The storages the recorded ops make, and when each is freed, where asked (:attr:`DispatchTrace.storages`)."""
        self._scope_cache: dict[frozenset[str], str] = {}
        self._last_scope: tuple[frozenset[str], str] = (frozenset(), "")
        self._signatures: dict[Any, Signature] = {}
        self.value_checks = ValueChecks()

    def add(self, signature: Signature, args: tuple, kwargs: dict, output: Any) -> None:
        path = self._current_scope()
        record = signature.record(args, kwargs, output, path.rpartition("/")[2], self.tracker.phase)
        record.nested = self._call_with_an_op == self.python_calls  # the Python call made an op already
        record.dtensor_ops, self.dtensor_ops = self.dtensor_ops, 0
        if self.bytecode is not None and record.phase == FORWARD:
            record.bytecode = self.bytecode.take()
        self._call_with_an_op = self.python_calls
        self.records.append((path, record))
        self.masked_scores.after(path, record)
        if self.storages is not None:
            self.storages.after_op(len(self.records) - 1, (args, kwargs), output)

    def after_the_forward(self, bytecode: int) -> None:
        """The model's Python after its last op (its output's making) on that op's record."""
        if self.records:
            self.records[-1][1].bytecode += bytecode

    def _current_scope(self) -> str:
        last_parents, last_scope = self._last_scope
        if self.tracker.parents == last_parents:  # most ops run in the module of the op before
            return last_scope
        parents = frozenset(self.tracker.parents)
        scope = self._scope_cache.get(parents)
        if scope is None:
            names = map(self.module_names.get, sorted(parents, key=_outermost_first))
            scope = "/".join(["", *filter(None, names)])
            self._scope_cache[parents] = scope
        self._last_scope = (parents, scope)
        return scope

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        if self.bytecode is None:
            return self._dispatch(func, types, args, kwargs or {})
        with self.bytecode.paused():
            return self._dispatch(func, types, args, kwargs or {})

    def _dispatch(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        if types and dispatches_to_dtensor(types):
            self.dtensor_ops += 1
            return NotImplemented
        if isinstance(func, torch._ops.HigherOrderOperator):  # no schema, not an op of its own (DTensor's RNG wrapper)
            return func(*args, **kwargs)
        passed = self.value_checks.answer(func, args)
        if passed is not None:
            return passed
        if not self.fake_ops_are_work and types and any(issubclass(t, FakeTensor) for t in types):
            self.inside_fake_op += 1
            try:
                return func(*args, **kwargs)
            finally:
                self.inside_fake_op -= 1
        signature = self._signatures.get(func)
        if signature is None:
            signature = self._signatures[func] = Signature.of(func._schema)
        if signature.written:
            for tensor in signature.written_tensors(args, kwargs):
                self.before_write(tensor)
        if signature.group is not None:
            self.ran_collectives = True
        output = func(*args, **kwargs)
        self.value_checks.after(func, output)
        if not (self.inside_function_level_op or self.inside_fake_op):
            self.add(signature, args, kwargs, output)
        return output


def _recomputed_in_the_backward() -> bool:
    """Whether this call runs in the forward of a non-reentrant activation checkpoint (its saved-tensor
    hooks, ``torch.utils.checkpoint``'s, are on top: transformers' ``gradient_checkpointing_enable``).
    The checkpoint runs the call again in the backward, where torch turns every torch function mode
    off, so natively: it must run so here too, or the tensors recomputed are not those saved (a
    whole call's fused stand-in saves a boolean mask, the math path a float one: ``CheckpointError``).
    Its record is the whole call's all the same; its backward is the path's it ran."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(True)
    return hooks is not None and getattr(hooks[0], "__module__", None) == "torch.utils.checkpoint"


class _FunctionLevelRecorder(TorchFunctionMode):
    """Records the ops of :data:`FUNCTION_LEVEL_OPS` (and ``whole``: more, by Python callable) as
    called, and mutes what they decompose into; counts Python's torch calls (the ops after the first
    of one call are marked ``nested``: a time's host charges one call)."""

    def __init__(self, ops: _OpRecorder, whole: Mapping[Callable[..., Any], str], fused: Mapping[str, Callable[..., Any]]) -> None:
        super().__init__()
        self.ops = ops
        self.function_level = {**FUNCTION_LEVEL_OPS, **whole}
        self.fused = fused

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        if self.ops.bytecode is None:
            return self._call(func, args, kwargs or {})
        with self.ops.bytecode.paused():
            return self._call(func, args, kwargs or {})

    def _call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        self.ops.python_calls += 1  # the calls it makes run with this mode off: one a call of Python's
        kind = self.function_level.get(func)
        if kind is None or self.ops.inside_function_level_op:
            return func(*args, **kwargs)
        run = func
        if (kind in self.fused and func not in FUNCTION_LEVEL_OPS and any(isinstance(value, torch.Tensor) and (value.is_meta or isinstance(value, FakeTensor)) for value in args[:1])
                and not _recomputed_in_the_backward()):
            run = self.fused[kind]
        self.ops.inside_function_level_op += 1
        try:
            output = run(*args, **kwargs)
        finally:
            self.ops.inside_function_level_op -= 1
        self.ops.add(_signature_for(kind, len(args) + len(kwargs)), args, kwargs, output)
        return output


@dataclass(frozen=True)
class DispatchTrace:
    """The recorded ops of one forward (and backward) call, each with its full scope path: an op
    source for the engine."""

    records: tuple[tuple[str, EagerOpRecord], ...]
    storages: tuple[StorageSpan, ...] = ()
    """The storages the ops made, by the index of their record, where the recording was asked to keep them (:mod:`jitflops.frontends.storage_spans`)."""

    def operations(self) -> Iterator[tuple[str, tuple[str, EagerOpRecord]]]:
        return ((record.kind, (path, record)) for path, record in self.records)

    @staticmethod
    def scope_of(item: tuple[str, EagerOpRecord]) -> str:
        return item[0]

    @staticmethod
    def record(item: tuple[str, EagerOpRecord], kind: str, module: str) -> OpRecord:
        return item[1]

    def scopes(self) -> Iterator[str]:
        return iter(dict.fromkeys(path for path, _ in self.records))

    @staticmethod
    def parts(item: tuple[str, EagerOpRecord]) -> tuple[()]:
        """Recorded ops are the kernels that ran: none is made of others."""
        return ()

    @staticmethod
    def replay_warnings(mode: str) -> None:
        """The model's warnings were shown as it ran."""


def _record_operator(recorder: _OpRecorder, inputs: list[Any], output: Any) -> None:
    """A higher-order operator's call as one op (``flex_attention``: :mod:`jitflops.frontends.flex_attention_ops`)."""
    if recorder.inside_function_level_op or recorder.inside_fake_op:
        return
    path = recorder._current_scope()
    outputs = [_decode(value) for value in (output if isinstance(output, (list, tuple)) else (output,))]
    record = EagerOpRecord(FLEX_ATTENTION_KIND, inputs, outputs, FLEX_ATTENTION_ARGUMENTS, path.rpartition("/")[2], recorder.tracker.phase)
    recorder.records.append((path, record))


@functools.lru_cache(maxsize=None)
def _flex_attention_recorded() -> None:
    """``flex_attention`` recorded as one op from the first recording on. Not at import: importing
    ``flex_attention`` imports sympy on torch 2.14 (a quarter of a second), which a default count
    does not need."""
    register_flex_attention(_OpRecorder, _record_operator, _decode)


def default_backward(output: Any) -> None:
    """Backward from the sum of every floating-point output that requires grad."""
    losses = [t.float().sum() for t in tensor_leaves(output) if t.requires_grad and t.is_floating_point()]
    if not losses:
        raise ValueError("the model returned no floating-point tensor that requires grad: nothing to run backward from")
    torch.stack(losses).sum().backward()


class _Unguarded:
    """What the recording of a private copy hands its ops instead of a snapshot: nothing is saved."""

    @staticmethod
    def save_before_write(tensor: torch.Tensor) -> None:
        return None


_UNGUARDED = _Unguarded()


def loss_backward(output: Any) -> None:
    """Backward from the output's ``loss`` where it has one that requires grad (a transformers
    model given labels), else from the sum of its floating-point outputs (:func:`default_backward`)."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        loss.backward()
    else:
        default_backward(output)


def record_with_dispatch(
    model: nn.Module,
    call: ModelCall,
    aliases: Mapping[Any, str],
    backward: Optional[BackwardFn] = None,
    fake_inputs: bool = False,
    guarded: bool = True,
    whole: Sequence[str] = (),
    whole_as_on_a_gpu: bool = False,
    count_bytecode: bool = False,
    track_storages: bool = False,
) -> DispatchTrace:
    """Run ``model`` on ``call`` eagerly under a dispatch mode (and ``backward`` on its output).
    ``fake_inputs``: the call's tensors are fake (sizes in symbols, :mod:`jitflops.engine.symbolic_counts`),
    so the model's ops run on fake tensors and are recorded. On meta or fake tensors, ops run the
    meta kernels that accept what the devices' kernels run (:data:`~jitflops.frontends.meta_values.DEVICE_META_KERNELS`).
    ``whole``: calls recorded as one op, run there by their fused kernel (:data:`AS_ITS_FUSED_KERNEL`;
    ``whole_as_on_a_gpu``: by a GPU's, :data:`AS_A_GPUS_FUSED_KERNEL`), their backward too.
    ``count_bytecode``: each forward op's record carries the model's Python bytecode run since the op
    before it (:mod:`jitflops.frontends.bytecode_count`). ``track_storages``: the trace keeps the
    storages its ops make and when each is freed (:attr:`DispatchTrace.storages`).

    The model comes back unchanged, gradients included: the backward runs on fresh ``.grad``
    fields, and every parameter's and input's ``.grad`` is put back afterwards. ``guarded=False``:
    the model is a private copy (a fake one), left as the run leaves it.

    A model on the meta device that reads a value there (transformers reads an attention mask's
    values to drop it when it masks nothing) is recorded again on the path it takes when traced
    (:func:`~jitflops.frontends.traced_path.on_the_traced_path`), which reads none: the JIT's
    count of a meta model takes that path too.
    """
    arguments = (model, call, aliases, backward, fake_inputs, guarded, whole, whole_as_on_a_gpu, count_bytecode, track_storages)
    try:
        return _recorded(*arguments)
    except TraceError as error:
        if fake_inputs and reads_a_fake_value(error.__cause__):
            error.add_note(READS_A_FAKE_VALUE)
        if fake_inputs or not holds_meta(list(model.parameters()), call) or not reads_a_meta_value(error.__cause__):
            raise
    with on_the_traced_path():
        try:
            return _recorded(*arguments)
        except TraceError as error:
            if reads_a_meta_value(error.__cause__):
                error.add_note(READS_A_VALUE)
            raise


def _recorded(model: nn.Module, call: ModelCall, aliases: Mapping[Any, str], backward: Optional[BackwardFn], fake_inputs: bool, guarded: bool,
              whole: Sequence[str], whole_as_on_a_gpu: bool, count_bytecode: bool, track_storages: bool) -> DispatchTrace:
    """One run of :func:`record_with_dispatch`."""
    # ModuleTracker names modules ``RootType.child.grandchild``, by any path that reaches them; the
    # root is the "" every scope starts with.
    root_type = type(model).__name__
    module_names = {f"{root_type}.{path}": name for path, name in aliases.items() if isinstance(path, str) and path}

    # The backward would add into existing gradients in place: it runs on fresh ``.grad`` fields.
    leaves = (list(model.parameters()) + [t for t in call.tensors() if t.requires_grad]) if backward is not None else []
    saved_grads = [t.grad for t in leaves]
    for tensor in leaves:
        tensor.grad = None
    _flex_attention_recorded()
    tracker = _ScopeTracker(backward is not None)
    bytecode = BytecodeCounter() if count_bytecode else None
    recorder: Optional[_OpRecorder] = None
    # What the recording leaves in reference cycles goes when it ends if it ran collectives: a
    # process whose ranks ran collectives aborted at exit otherwise, 3 runs in 8 (a collection of
    # the young generations alone did not do)
    try:
        with (
            own_cycles_collected(lambda: recorder is not None and recorder.ran_collectives),
            preserved(model, values_on_write=True) if guarded else nullcontext(_UNGUARDED) as snapshot,
            flex_attention_uncompiled(),
            meta_kernels(DEVICE_META_KERNELS) if fake_inputs or holds_meta(list(model.parameters()), call) else nullcontext(),
            torch.set_grad_enabled(backward is not None),
            tracker,
            _OpRecorder(tracker, module_names, snapshot.save_before_write, fake_inputs, bytecode, StorageSpans() if track_storages else None) as recorder,
            _FunctionLevelRecorder(recorder, {function: kind for kind in whole for function in _python_entry_points(kind)},
                                   AS_A_GPUS_FUSED_KERNEL if whole_as_on_a_gpu else AS_ITS_FUSED_KERNEL),
        ):
            with bytecode or nullcontext():
                output = call.run(model)
            if bytecode is not None:
                recorder.after_the_forward(bytecode.take())
            if backward is not None:
                backward(output)
    except Exception as error:
        running = [name for name in map(module_names.get, tracker.running_when(error)) if name]
        module = max(running, key=lambda name: name.count("."), default="")  # the innermost running module
        failed = model.get_submodule(module) if module else model
        raise TraceError(module, type(failed).__name__, error) from error
    finally:
        for tensor, grad in zip(leaves, saved_grads):
            tensor.grad = grad
    return DispatchTrace(tuple(recorder.records), recorder.storages.spans() if recorder.storages is not None else ())
