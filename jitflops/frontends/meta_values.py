"""Counting without computing: a trace on values without data.

A count depends only on shapes, so the JIT front end traces a copy of the model whose parameters,
buffers and inputs are ``meta`` tensors of the same shapes, dtypes and flags: the tracer records
the same graph, and no kernel runs (a BERT-large forward is traced in a fraction of its run time,
and no activation memory is allocated). The user's model is never touched.

Some models need real values: data-dependent control flow (``if x.sum() > 0``), tensors made on
the CPU inside ``forward`` and mixed with the inputs, ops without a meta kernel, lazy or quantised
parameters. Those fail on meta and are traced again on real values, with identical results; the
reason is logged at debug level.

Convolutions are traced on meta values through a kernel of jitflops'. torch's meta kernel for
``aten::convolution`` is Python code that compares sizes, and under the JIT tracer sizes read in
Python are traced tensors, so it fails (``cond must be a bool, but got a Tensor``); and the tracer
does not record ``aten::convolution`` (it records ``aten::_convolution``, which the CPU and CUDA
kernels call, but the meta kernel does not). For the duration of a meta trace, the meta kernel of
``aten::convolution`` is one that calls ``aten::_convolution``: the tracer records the same node as
on real values, and no Python code reads sizes. Products, layer norms and softmax get meta kernels
that compute their output shapes directly, where torch's are Python decompositions (the bulk of a
meta trace's time otherwise). A meta trace in which a value became a tensor
constant (an op the tracer did not record) is not trusted and falls back to real values.
"""

from __future__ import annotations

import copy
import math
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
from torch import nn
from torch._decomp import global_decomposition_table
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.parameter import UninitializedTensorMixin
from torch.utils import _pytree as pytree

from ..core.model_io import ModelCall, is_stateful

COMPUTE_BELOW_WORK = 2e9
"""Calls estimated below this many parameter-tokens (a dense model does about 2 x parameters x
tokens FLOPs) are traced on real values by default: there the forward costs less than the meta
trace's extra work (copying the model, the untraced meta run, meta kernels in Python, about 50 us
an op). Measured by the default count, real against meta values (2-core CPU, medians of 7):
the built-in Transformer (3e7) 4.0 against 9.4 ms, MobileNetV2 (4e8) 59 against 65, Llama GQA
(8e8) 27 against 31, a search-space candidate (``tools/bench.py --only search``; 4e6) 17 against
23; above, meta wins: ResNet-50 (4.6e9) 47 against 72, ConvNeXt-T (5.5e9) 35 against 77, BERT-base
(1.4e10) 71 against 217. T5-small (7.7e9, 3,000 nodes for 60 M parameters) is the one model
above it that computes faster (154 against 175 ms)."""

CALLS_COMPUTE_BELOW_WORK = 1e8
"""The same threshold for a count read from the model's calls (:mod:`jitflops.frontends.call_recording`):
there a meta run costs only the copy and the forward on meta values, not a trace. Measured, calls
on real values against a meta copy (2-core CPU, medians of 7): the built-in Transformer (3e7) 1.7
against 3.7 ms, the small CNN 0.6 against 1.2; above, meta wins: MobileNetV2 (4e8) 14.8 against
20.3, Llama GQA (8e8) 9.8 against 14.6."""

COMPUTE_BELOW_ELEMENTS = 2**22
"""Inputs with more elements than this are traced on meta values whatever the estimated work: a
small network on a large image does far more work than its parameters x patches suggest (its
convolutions run at every pixel), and holds activations to match."""

def _convolution_on_meta(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: list[int], padding: list[int],
                         dilation: list[int], transposed: bool, output_padding: list[int], groups: int) -> torch.Tensor:
    """``aten::convolution`` for meta tensors, as the CPU kernel runs it: through ``aten::_convolution``.
    Outside the JIT tracer, torch's own meta kernel: a FakeTensorMode can still reach this one after
    the trace has removed it (seen on torch 2.11 and 2.13), and on torch 2.11 ``aten::_convolution``
    then ends in ``convolution_overrideable``, which has no meta kernel any more. (Not through
    :func:`_convolution_overrideable_on_meta`: FakeTensorMode refuses a change of the tracing state.)"""
    if torch._C._get_tracing_state() is None:
        return global_decomposition_table["meta"][torch.ops.aten.convolution.default](input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    return torch.ops.aten._convolution.default(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, False, False, True, True)


def _convolution_overrideable_on_meta(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: list[int], padding: list[int],
                                      dilation: list[int], transposed: bool, output_padding: list[int], groups: int) -> torch.Tensor:
    """``aten::convolution_overrideable``, where ``aten::_convolution`` ends for meta tensors in older
    torch (2.10): torch's own meta convolution, run below the tracer's ``aten::_convolution`` node
    with the tracing state suspended, since it reads sizes."""
    kernel = global_decomposition_table["meta"][torch.ops.aten.convolution.default]
    state = torch._C._get_tracing_state()
    torch._C._set_tracing_state(None)
    try:
        return kernel(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    finally:
        torch._C._set_tracing_state(state)


def _output_like(tensor: torch.Tensor, dtype: Optional[torch.dtype] = None, contiguous: bool = False) -> torch.Tensor:
    """``torch.empty_like(tensor)`` for a meta tensor, through torch's C++ kernels: ``empty_like``'s meta
    kernel is Python (``torch._refs``), about 10 us a call, a quarter of a MobileNetV2 forward on
    meta values. Contiguous, or channels-last where ``tensor`` is; other layouts as ``empty_like``."""
    dtype = dtype or tensor.dtype
    if contiguous or tensor.is_contiguous():
        return tensor.new_empty(tensor.shape, dtype=dtype)
    if tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last):
        return torch.empty(tensor.shape, dtype=dtype, device=tensor.device, memory_format=torch.channels_last)
    return torch.empty_like(tensor, dtype=dtype)


def _addmm_on_meta(input: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: Any = 1, alpha: Any = 1) -> torch.Tensor:
    if mat1.dim() != 2 or mat2.dim() != 2 or mat1.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({'x'.join(map(str, mat1.shape))} and {'x'.join(map(str, mat2.shape))})")
    return mat1.new_empty((mat1.shape[0], mat2.shape[1]))


def _layer_norm_on_meta(input: torch.Tensor, normalized_shape: list[int], weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                        eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aten::native_layer_norm``: the output, and the mean and reciprocal deviation per row, in the
    input's dtype (as the CPU kernel returns them)."""
    if list(input.shape[input.dim() - len(normalized_shape):]) != list(normalized_shape) or input.dim() < len(normalized_shape):
        raise RuntimeError(f"Given normalized_shape={list(normalized_shape)}, expected input with shape [*, {', '.join(map(str, normalized_shape))}], but got input of size {list(input.shape)}")
    rows = list(input.shape[: input.dim() - len(normalized_shape)]) + [1] * len(normalized_shape)
    return _output_like(input, contiguous=True), input.new_empty(rows), input.new_empty(rows)


def _safe_softmax_on_meta(input: torch.Tensor, dim: int, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    if not -max(input.dim(), 1) <= dim < max(input.dim(), 1):
        raise IndexError(f"Dimension out of range (expected to be in range of [{-max(input.dim(), 1)}, {max(input.dim(), 1) - 1}], but got {dim})")
    return _output_like(input, dtype, contiguous=True)


def _batch_statistics(input: torch.Tensor, weight: Optional[torch.Tensor], running_mean: Optional[torch.Tensor], training: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch norm's checks, and its saved mean and reciprocal deviation: per channel in training,
    empty otherwise (as the CPU kernel returns them)."""
    channels = input.shape[1] if input.dim() > 1 else 0
    for name, tensor in (("weight", weight), ("running_mean", running_mean)):
        if tensor is not None and tensor.numel() != channels:
            raise RuntimeError(f"{name} should contain {channels} elements not {tensor.numel()}")
    kept = channels if training else 0
    return input.new_empty((kept,)), input.new_empty((kept,))


def _batch_norm_on_meta(input: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], running_mean: Optional[torch.Tensor],
                        running_var: Optional[torch.Tensor], training: bool, momentum: float, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aten::native_batch_norm`` and ``aten::_native_batch_norm_legit``: the output, and the statistics."""
    return (_output_like(input), *_batch_statistics(input, weight, running_mean, training))


def _batch_norm_no_training_on_meta(input: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], running_mean: torch.Tensor,
                                    running_var: torch.Tensor, momentum: float, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (_output_like(input), *_batch_statistics(input, weight, running_mean, False))


def _same_shape(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """An elementwise activation: its output is shaped as its input."""
    return _output_like(self)


def _in_place(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """An elementwise activation in place: its input."""
    return self


_ELEMENTWISE = ("hardtanh", "relu", "gelu", "hardswish", "hardsigmoid")

TRACING_META_KERNELS: dict[str, Callable[..., Any]] = {
    "convolution": _convolution_on_meta,
    "convolution_overrideable": _convolution_overrideable_on_meta,
    "addmm": _addmm_on_meta,
    "native_layer_norm": _layer_norm_on_meta,
    "_safe_softmax": _safe_softmax_on_meta,
    "native_batch_norm": _batch_norm_on_meta,
    "_native_batch_norm_legit": _batch_norm_on_meta,
    "_native_batch_norm_legit_no_training": _batch_norm_no_training_on_meta,
    **{name: _same_shape for name in _ELEMENTWISE},
    **{f"{name}_": _in_place for name in _ELEMENTWISE},
}
"""The meta kernels a meta trace runs: convolution so that it traces at all; the others because
torch's are Python decompositions into elementwise references (``torch._refs``), which made up most
of a meta trace of ViT-L and of MobileNet-like models (``tools/bench.py``; a batch norm 1.4 ms, a
``hardtanh`` 1.7 ms, where the CPU computes them in microseconds); these check their operands'
shapes and compute the output shapes directly."""


@contextmanager
def meta_kernels_for_tracing() -> Iterator[None]:
    """For the body, meta tensors run :data:`TRACING_META_KERNELS` (see the module's docstring)."""
    library = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():  # torch says a kernel is overridden: for this trace only
            warnings.simplefilter("ignore")
            for name, kernel in TRACING_META_KERNELS.items():
                library.impl(name, kernel, "Meta", allow_override=True)
        yield
    finally:
        library._destroy()


def _empty_like(tensor: torch.Tensor, device: str, swapped: dict[int, torch.Tensor], fake_mode: Optional[FakeTensorMode] = None) -> torch.Tensor:
    """A tensor like ``tensor`` on ``device``, without values (a Parameter stays a Parameter); one
    per tensor, so shared weights stay shared. With ``fake_mode``, a fake tensor of it."""
    if id(tensor) not in swapped:
        if fake_mode is None:
            empty = torch.empty_like(tensor, device=device)
        else:
            with fake_mode:
                empty = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=device)
        swapped[id(tensor)] = nn.Parameter(empty, requires_grad=tensor.requires_grad) if isinstance(tensor, nn.Parameter) else empty.requires_grad_(tensor.requires_grad)
    return swapped[id(tensor)]


def _plain(tensor: torch.Tensor) -> bool:
    return type(tensor) in (torch.Tensor, nn.Parameter)


def module_blocker(name: str, module: nn.Module) -> Optional[str]:
    """Why ``module`` (the model's module ``name``) cannot run on meta values (None: it can try)."""
    if isinstance(module, nn.MultiheadAttention):
        return f"{name or 'the model'} is a MultiheadAttention, whose fused eval path runs for CPU and CUDA tensors only"
    for key, tensor in [*module._parameters.items(), *module._buffers.items()]:
        if tensor is not None and not _plain(tensor):
            return f"{f'{name}.{key}' if name else key} is a {type(tensor).__name__}"
    return None


def call_blocker(call: ModelCall) -> Optional[str]:
    """Why the model cannot be called with ``call`` on meta values (None: it can try)."""
    leaves = pytree.tree_leaves((call.args, call.kwargs))
    if any(is_stateful(leaf) for leaf in leaves):
        return "the call passes an object holding state (a cache)"
    if any(isinstance(leaf, torch.Tensor) and not _plain(leaf) for leaf in leaves):
        return "an input is a tensor subclass"
    return None


def meta_blocker(model: nn.Module, call: ModelCall) -> Optional[str]:
    """Why ``model`` cannot be traced on meta values with ``call`` (None: it can try)."""
    for name, module in model.named_modules():
        blocker = module_blocker(name, module)
        if blocker is not None:
            return blocker
    return call_blocker(call)


def _tokens(tensor: torch.Tensor) -> int:
    """How many times a dense model applies its weights to this input: token ids, one per element;
    images (4 or more dimensions), one per 16 x 16 patch of pixels (a ViT's tokens; about what a
    ResNet's FLOPs over its parameters come to); other inputs, their elements over the last
    dimension (the features)."""
    if not tensor.is_floating_point():
        return tensor.numel()
    if tensor.dim() >= 4:
        return max(tensor.shape[0] * math.prod(tensor.shape[2:]) // 256, 1)
    return tensor.numel() // max(tensor.shape[-1], 1)


def estimated_work(parameters: Sequence[torch.Tensor], call: ModelCall) -> int:
    """Parameters x tokens of the largest input: about half a dense model's FLOPs."""
    tokens = max((_tokens(t) for t in call.tensors() if t.dim()), default=1)
    return sum(p.numel() for p in parameters) * tokens


def computes_by_default(model: nn.Module, parameters: Sequence[torch.Tensor], call: ModelCall, below_work: float = COMPUTE_BELOW_WORK) -> bool:
    """Whether to trace on real values unless asked otherwise (``parameters``: the model's):
    small calls (``below_work``, ``COMPUTE_BELOW_ELEMENTS``), where computing costs less
    than the meta trace's extra work, lazy modules, and recurrent layers, whose meta kernels are
    Python loops over the time steps (an LSTM of 32 steps: 480 ms on meta, 15 ms computed)."""
    if any(isinstance(p, UninitializedTensorMixin) for p in parameters):
        return True
    if any(isinstance(module, nn.RNNBase) for module in model.modules()):
        return True
    largest = max((t.numel() for t in call.tensors()), default=0)
    return estimated_work(parameters, call) < below_work and largest <= COMPUTE_BELOW_ELEMENTS


def empty_copy(model: nn.Module, call: ModelCall, device: str = "meta", fake_mode: Optional[FakeTensorMode] = None) -> tuple[nn.Module, ModelCall, dict[nn.Module, nn.Module]]:
    """A copy of ``model`` whose parameters and buffers are tensors without values on ``device``
    (meta: no memory either; with ``fake_mode``, its fake tensors of ``device``), the call with
    such inputs, and each of the model's modules mapped to its copy.

    The copy shares everything else with the model (code, attributes, hooks): it is made module by
    module with ``copy.copy`` and new parameter, buffer and child tables. The user's model is not
    touched, so other threads may keep using it while the copy is traced. A fake copy also has its
    own tables of hooks (the user's hooks in them), since what runs on it may register more
    (FSDP2, activation checkpointing).
    """
    swapped: dict[int, torch.Tensor] = {}
    copies: dict[nn.Module, nn.Module] = {}
    pending = [model]
    while pending:  # every module once, shared ones too
        module = pending.pop()
        if module not in copies:
            copies[module] = copy.copy(module)
            pending.extend(child for child in module._modules.values() if child is not None)
    for module, twin in copies.items():
        twin.__dict__["_parameters"] = {name: None if p is None else _empty_like(p, device, swapped, fake_mode) for name, p in module._parameters.items()}
        twin.__dict__["_buffers"] = {name: None if b is None else _empty_like(b, device, swapped, fake_mode) for name, b in module._buffers.items()}
        if fake_mode is not None:
            twin.__dict__.update({name: copy.copy(value) for name, value in vars(module).items() if name.endswith("hooks") or name.endswith("hooks_with_kwargs") or name.endswith("always_called")})
        twin.__dict__["_modules"] = {name: None if child is None else copies[child] for name, child in module._modules.items()}
    twin = copies[model]
    leaves, spec = pytree.tree_flatten((call.args, call.kwargs))
    args, kwargs = pytree.tree_unflatten([_empty_like(leaf, device, swapped, fake_mode) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec)
    return twin, ModelCall(args, kwargs), copies


MATERIALISE_META_BYTES = 4 * 2**30
"""A model built on the meta device that cannot be traced there (convolutions) is traced on a
copy with uninitialised CPU tensors, up to this size."""


def holds_meta(parameters: Sequence[torch.Tensor], call: ModelCall) -> bool:
    """Whether the model (``parameters``: its) or the call is on the meta device."""
    return any(t.is_meta for t in [*parameters, *call.tensors()])


def size_in_bytes(model: nn.Module, call: ModelCall) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers(), *call.tensors()])


def lost_values(graph: "torch._C.Graph", model: nn.Module) -> list[str]:
    """Values a meta trace turned into tensor constants: ops the tracer did not record. The
    model's own tensors that are not graph inputs (non-persistent buffers) are constants in any
    trace, and so are empty tensors and scalars made in ``forward`` (a cache's first state). A
    tensor made from data in ``forward`` (``torch.tensor([1, 2], device=x.device)``) is flagged too:
    tracing on real values costs more, and counts the same."""
    own = {tensor._cdata for tensor in list(model.parameters()) + list(model.buffers())}
    return [
        node.output().debugName()
        for node in graph.nodes()
        if node.kind() == "prim::Constant"
        and isinstance(node.output().type(), torch._C.TensorType)
        and node.output().type().device() == torch.device("meta")
        and node.t("value").numel() > 1
        and node.t("value")._cdata not in own
    ]
