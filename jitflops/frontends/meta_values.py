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
on real values, and no Python code reads sizes. Products, norms, softmax, activations, residual
additions, averages and causal masks get meta kernels that compute their output shapes directly,
where torch's are Python decompositions (the bulk of a meta trace's time otherwise). A meta trace
in which a value became a tensor constant (an op the tracer did not record) is not trusted and
falls back to real values.
"""

from __future__ import annotations

import copy
import copyreg
import functools
import math
import types
import warnings
from contextlib import contextmanager
from typing import Any, Callable, ContextManager, Hashable, Iterator, Mapping, Optional, Sequence

import torch
from torch.nn.utils import parametrize
from torch import _refs
from torch import nn
from torch._decomp import global_decomposition_table
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode
from torch.nn.parameter import UninitializedTensorMixin
from torch.utils import _pytree as pytree

from ..core.errors import JitflopsError
from ..core.imported_classes import is_compiled
from ..core.model_io import ModelCall, is_stateful
from ..core.tied_weights import has_broken_ties, value_keys, values_key

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

PATCH_PIXELS = 256
"""An image's pixels per token in the estimate of a trace's work: a ViT's 16 x 16 patch, about what
a ResNet's FLOPs over its parameters come to at 224 x 224."""

CALLS_COMPUTE_BELOW_WORK = 1e8
"""The same threshold for a count read from the model's calls (:mod:`jitflops.frontends.call_recording`),
with :data:`CALLS_PIXELS_PER_TOKEN`: there a meta run costs only the copy and the forward on meta
values, about 10 us a call, not a trace. Measured, calls on real values against a meta copy (2-core
CPU, medians of 30): the built-in Transformer (3e7) 1.4 against 3.1 ms, the small CNN (6e6) 0.55
against 0.86; above, meta wins: MobileNet-like candidates of the bench's search space on 64 x 64
images (1e8 to 1e9) 2.9 against 2.5 ms to 4.8 against 3.0, Llama GQA (8e8) 14.9 against 8.9,
MobileNetV2 (1e10) 22 against 11."""

CALLS_PIXELS_PER_TOKEN = 1
"""An image's pixels per token in that estimate: every pixel. A convolution runs at every position,
and on the CPU a small network's convolutions cost more per multiply-add than a transformer's
products, where a meta copy's cost is per call: counted as patches, the search space's candidates
(1e6 to 4e6) computed, 1.3 times slower than on a meta copy."""

COMPUTE_BELOW_ELEMENTS = 2**22
"""Inputs with more elements than this are traced on meta values whatever the estimated work: a
small network on a large image does far more work than its parameters x patches suggest (its
convolutions run at every pixel), and holds activations to match."""

def _convolution_shape(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: list[int], padding: list[int],
                       dilation: list[int], groups: int) -> Optional[list[int]]:
    """The output shape of a convolution (not transposed) of contiguous operands, where they are valid;
    None otherwise (torch's meta kernel then checks them, in Python: 30 us a call, a third of a
    MobileNetV2 forward on meta values, and raises its own error where they are not valid)."""
    spatial = weight.dim() - 2
    if not (
        spatial > 0 and input.dim() == weight.dim() and len(stride) == len(padding) == len(dilation) == spatial and groups > 0
        and input.shape[1] == weight.shape[1] * groups and weight.shape[0] % groups == 0 and input.dtype == weight.dtype
        and (bias is None or (bias.dim() == 1 and bias.shape[0] == weight.shape[0])) and input.is_contiguous() and weight.is_contiguous()
    ):
        return None
    sizes = [(size + 2 * pad - step * (kernel - 1) - 1) // stride_ + 1
             for size, kernel, stride_, pad, step in zip(input.shape[2:], weight.shape[2:], stride, padding, dilation)]
    return [input.shape[0], weight.shape[0], *sizes] if all(size > 0 for size in sizes) and min(stride) > 0 else None


def _convolution_on_meta(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: list[int], padding: list[int],
                         dilation: list[int], transposed: bool, output_padding: list[int], groups: int) -> torch.Tensor:
    """``aten::convolution`` for meta tensors, as the CPU kernel runs it: through ``aten::_convolution``.
    Outside the JIT tracer, torch's own meta kernel: a FakeTensorMode can still reach this one after
    the trace has removed it (seen on torch 2.11 and 2.13), and on torch 2.11 ``aten::_convolution``
    then ends in ``convolution_overrideable``, which has no meta kernel any more. (Not through
    :func:`_convolution_overrideable_on_meta`: FakeTensorMode refuses a change of the tracing state.)"""
    if torch._C._get_tracing_state() is None:
        shape = None if transposed else _convolution_shape(input, weight, bias, stride, padding, dilation, groups)
        if shape is not None:
            return _empty(input, shape)
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


def _empty(like: torch.Tensor, shape: Sequence[int], dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A contiguous tensor of ``shape`` on ``like``'s device, with its dtype unless ``dtype`` is given,
    through torch's C++ kernels: on meta tensors, ``empty_like`` and ``new_empty`` are Python
    (``torch._refs``), about 10 us a call, a quarter of a MobileNetV2 forward on meta values."""
    return torch.empty(shape, dtype=dtype or like.dtype, device=like.device)


def _output_like(tensor: torch.Tensor, dtype: Optional[torch.dtype] = None, contiguous: bool = False) -> torch.Tensor:
    """``torch.empty_like(tensor)`` for a meta tensor, through torch's C++ kernels (:func:`_empty`).
    Contiguous, or channels-last where ``tensor`` is; other layouts as ``empty_like``."""
    dtype = dtype or tensor.dtype
    if contiguous or tensor.is_contiguous():
        return _empty(tensor, tensor.shape, dtype)
    if tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last):
        return torch.empty(tensor.shape, dtype=dtype, device=tensor.device, memory_format=torch.channels_last)
    return torch.empty_like(tensor, dtype=dtype)


_GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""What ``aten::_grouped_mm`` runs on the CPU and on CUDA (whose fast path takes bfloat16 and loops
over ``mm`` for the others)."""


def _masked_fill_on_meta(self: torch.Tensor, mask: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``aten::masked_fill.Tensor`` on meta tensors, with a value from the CPU. The devices' kernels
    take a 0-dim CPU value (``x.masked_fill(mask, torch.tensor(torch.finfo(x.dtype).min))``, SEW-D's
    masked softmax, as DeBERTa's was), and so does torch's reference for CUDA, XPU, MPS and HPU
    tensors, but not for meta ones. The value goes to the meta device first; torch's reference checks
    the rest."""
    if value.dim() == 0 and value.device.type == "cpu" and self.is_meta:
        value = value.to("meta")
    return _refs.masked_fill(self, mask, value)


def _grouped_mm_on_meta(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                        out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``aten::_grouped_mm`` on meta and fake tensors, in every dtype the CPU and CUDA kernels run.
    torch's meta kernel checks the CUDA fast path's bfloat16 alone, so transformers' float32 experts,
    which run on both devices, failed on meta and under the memory estimate's fake tensors. Their
    output as torch's kernels make it: (tokens, N) for a 2-D by 3-D product, rows padded to 16 bytes
    on a CUDA build. bfloat16 operands, and any others, go to torch's own kernel, which checks them."""
    torch_kernel = global_decomposition_table["meta"][torch.ops.aten._grouped_mm.default]
    if (
        mat_a.dtype == torch.bfloat16 or mat_a.dtype not in _GROUPED_MM_DTYPES or mat_b.dtype != mat_a.dtype
        or mat_a.dim() not in (2, 3) or mat_b.dim() not in (2, 3) or (mat_a.dim() == mat_b.dim() == 2 and offs is None)
    ):
        return torch_kernel(mat_a, mat_b, offs, bias, out_dtype)
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        shape = [offs.size(0), mat_a.size(0), mat_b.size(1)]
    elif mat_a.dim() == 2:
        shape = [mat_a.size(0), mat_b.size(-1)]
    elif mat_b.dim() == 2:
        shape = [mat_a.size(1), mat_b.size(1)]
    else:
        shape = [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]
    dtype = out_dtype or mat_a.dtype
    alignment = 16 // dtype.itemsize if torch.version.cuda else 1
    row = -(-shape[-1] // alignment) * alignment
    strides = [row, 1] if len(shape) == 2 else [shape[1] * row, row, 1]
    return torch.empty_strided(shape, strides, dtype=dtype, device=mat_a.device)


def _addmm_on_meta(input: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: Any = 1, alpha: Any = 1) -> torch.Tensor:
    if mat1.dim() != 2 or mat2.dim() != 2 or mat1.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({'x'.join(map(str, mat1.shape))} and {'x'.join(map(str, mat2.shape))})")
    return _empty(mat1, (mat1.shape[0], mat2.shape[1]))


def _layer_norm_on_meta(input: torch.Tensor, normalized_shape: list[int], weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                        eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aten::native_layer_norm``: the output, and the mean and reciprocal deviation per row, in the
    input's dtype (as the CPU kernel returns them)."""
    if list(input.shape[input.dim() - len(normalized_shape):]) != list(normalized_shape) or input.dim() < len(normalized_shape):
        raise RuntimeError(f"Given normalized_shape={list(normalized_shape)}, expected input with shape [*, {', '.join(map(str, normalized_shape))}], but got input of size {list(input.shape)}")
    rows = list(input.shape[: input.dim() - len(normalized_shape)]) + [1] * len(normalized_shape)
    return _output_like(input, contiguous=True), _empty(input, rows), _empty(input, rows)


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
    return _empty(input, (kept,)), _empty(input, (kept,))


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


def _arithmetic(ref: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A binary arithmetic op (``add``, ``sub``, ``mul``) of a contiguous floating-point tensor and a
    contiguous tensor of the same dtype and device (a residual connection; a norm's scale, a rotary
    embedding's cosines: broadcast), or a number (a 0-dim tensor on the CPU, as torch passes a Python
    number): its output is contiguous, of the broadcast shape (the CPU's kernel gives that for every
    such pair: ``test_counting_without_computing.py``). Other operands go to torch's own meta kernel,
    the Python reference ``ref``, which broadcasts and promotes (about 60 us a call: half of a small
    CNN's forward on meta values, 0.5 ms a call in a 70B Llama's norms); so do Python numbers, which
    torch's Python dispatcher passes as they are (``rsub``'s reference under a ``FakeTensorMode``)."""

    def kernel(self: Any, other: Any, **kwargs: Any) -> torch.Tensor:
        if isinstance(self, torch.Tensor) and isinstance(other, torch.Tensor) and self.is_floating_point() and self.is_contiguous():
            if self.dtype == other.dtype and other.is_contiguous() and self.device == other.device:
                return _empty(self, self.shape if self.shape == other.shape else torch.broadcast_shapes(self.shape, other.shape))
            if other.dim() == 0 and not other.is_complex() and not other.is_meta:  # a number: the floating tensor's dtype wins
                return _empty(self, self.shape)
        return ref(self, other, **kwargs)

    return kernel


def _unary(ref: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A unary op of a floating-point tensor (``neg``, ``rsqrt``; ``pow`` by a real number: a norm's
    square): its output is laid out as its input (the CPU's kernel gives that for every layout:
    ``test_counting_without_computing.py``). torch's meta kernel is the Python reference ``ref``
    (0.3 ms a call: rotary embeddings and norms, six calls a block of a Llama); other operands go to it."""

    def kernel(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        if isinstance(self, torch.Tensor) and self.is_floating_point() and not kwargs and all(
                isinstance(arg, (int, float)) and not isinstance(arg, bool) for arg in args):
            return _output_like(self)
        return ref(self, *args, **kwargs)

    return kernel


def _triangle(ref: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``tril`` and ``triu`` (a causal mask, made in every attention call that asks for one): shaped as
    the input, a matrix or a batch of them. torch's meta kernel is the Python reference ``ref``, about
    ten elementwise references deep (1 ms a call)."""

    def kernel(self: torch.Tensor, diagonal: int = 0) -> torch.Tensor:
        return _output_like(self) if self.dim() >= 2 else ref(self, diagonal)

    return kernel


def _mean_on_meta(self: torch.Tensor, dim: Optional[list[int]], keepdim: bool = False, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``aten::mean.dim`` of a floating-point tensor over given dimensions (a global average pool: an
    ``adaptive_avg_pool2d`` to 1 x 1 is one). torch's meta kernel is a Python reference, whose first
    call imports ``torch._dynamo`` (a second); other calls go to it."""
    rank = max(self.dim(), 1)
    if dtype is not None or not dim or not self.is_floating_point() or any(not -rank <= axis < rank for axis in dim):
        return _refs.mean(self, dim, keepdim, dtype=dtype)
    reduced = {axis % rank for axis in dim}
    shape = [1 if axis in reduced else size for axis, size in enumerate(self.shape)] if keepdim else [size for axis, size in enumerate(self.shape) if axis not in reduced]
    return _empty(self, shape)


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
    **{f"{name}.Tensor": _arithmetic(getattr(_refs, name)) for name in ("add", "sub", "mul")},
    **{name: _triangle(getattr(_refs, name)) for name in ("tril", "triu")},
    "neg": _unary(_refs.neg),
    "rsqrt": _unary(_refs.rsqrt),
    "pow.Tensor_Scalar": _unary(_refs.pow),
    "mean.dim": _mean_on_meta,
    "_grouped_mm": _grouped_mm_on_meta,
    "masked_fill.Tensor": _masked_fill_on_meta,
}
"""The meta kernels a meta trace (and a count read from the calls of a meta copy) runs: convolution
so that it traces at all, and fast where its operands are contiguous; the others because torch's
are Python decompositions into elementwise references (``torch._refs``), which made up most of a
meta trace of ViT-L and of MobileNet-like models (``tools/bench.py``; a batch norm 1.4 ms, a
``hardtanh`` 1.7 ms, where the CPU computes them in microseconds); these check their operands'
shapes and compute the output shapes directly, or hand what they do not check to torch's own."""


DEVICE_META_KERNELS: dict[str, Callable[..., Any]] = {"_grouped_mm": _grouped_mm_on_meta, "masked_fill.Tensor": _masked_fill_on_meta}
"""The meta kernels that accept what the devices' kernels run, where torch's refuse it: what a run
on fake tensors (the memory estimate, counts as formulas) needs to take the path the model takes."""


@contextmanager
def meta_kernels(kernels: Mapping[str, Callable[..., Any]]) -> Iterator[None]:
    """For the body, meta and fake tensors run ``kernels`` (by aten op name) instead of torch's.
    torch's fake tensors keep the outputs they computed in a cache of their class, so a fake run
    after the body may still meet an output of one of these (the reason each is exact)."""
    library = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():  # torch says a kernel is overridden: for this run only
            warnings.simplefilter("ignore")
            for name, kernel in kernels.items():
                library.impl(name, kernel, "Meta", allow_override=True)
        yield
    finally:
        library._destroy()


def meta_kernels_for_tracing() -> ContextManager[None]:
    """For the body, meta tensors run :data:`TRACING_META_KERNELS` (see the module's docstring)."""
    return meta_kernels(TRACING_META_KERNELS)


def _twin_tensor(tensor: torch.Tensor, make: Callable[[torch.Tensor], torch.Tensor], swapped: dict[Hashable, torch.Tensor],
                 keys: Mapping[int, Hashable]) -> torch.Tensor:
    """``make(tensor)`` (a Parameter stays a Parameter); one per set of values (``keys``: the
    model's parameters', :func:`~jitflops.core.tied_weights.value_keys`; else
    :func:`~jitflops.core.tied_weights.values_key`), so shared weights stay shared, and ties that
    ``init_empty_weights`` broke are made again."""
    key = keys[id(tensor)] if id(tensor) in keys else values_key(tensor)
    if key not in swapped:
        made = make(tensor)
        kind = type(tensor)  # isinstance(tensor, nn.Parameter) runs the Parameter metaclass's Python: asked only of subclasses
        is_parameter = kind is nn.Parameter or (kind is not torch.Tensor and isinstance(tensor, nn.Parameter))
        swapped[key] = nn.Parameter(made, requires_grad=tensor.requires_grad) if is_parameter else made.requires_grad_(tensor.requires_grad)
    return swapped[key]


def _without_values(device: str, fake_mode: Optional[FakeTensorMode]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A tensor like a given one on ``device``, without values; with ``fake_mode``, a fake tensor of it."""
    def make(tensor: torch.Tensor) -> torch.Tensor:
        if fake_mode is None:
            return torch.empty_like(tensor, device=device)
        with fake_mode:
            return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=device)
    return make


def _with_values(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone()


def _plain(tensor: torch.Tensor) -> bool:
    return type(tensor) in (torch.Tensor, nn.Parameter)


SCRIPTED = "a TorchScript module, whose compiled code holds its own weights, which a copy without values cannot replace"


def module_blocker(name: str, module: nn.Module) -> Optional[str]:
    """Why ``module`` (the model's module ``name``) cannot run on meta values (None: it can try)."""
    if isinstance(module, nn.MultiheadAttention):
        return f"{name or 'the model'} is a MultiheadAttention, whose fused eval path runs for CPU and CUDA tensors only"
    if isinstance(module, torch.jit.ScriptModule):
        return f"{name or 'the model'} is {SCRIPTED}"
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


def _tokens(tensor: torch.Tensor, pixels_per_token: int) -> int:
    """How many times a dense model applies its weights to this input: token ids, one per element;
    images (4 or more dimensions), one per ``pixels_per_token`` pixels; other inputs, their
    elements over the last dimension (the features)."""
    if not tensor.is_floating_point():
        return tensor.numel()
    if tensor.dim() >= 4:
        return max(tensor.shape[0] * math.prod(tensor.shape[2:]) // pixels_per_token, 1)
    return tensor.numel() // max(tensor.shape[-1], 1)


def estimated_work(parameters: Sequence[torch.Tensor], call: ModelCall, pixels_per_token: int = PATCH_PIXELS) -> int:
    """Parameters x tokens of the largest input: about half a dense model's FLOPs."""
    tokens = max((_tokens(t, pixels_per_token) for t in call.tensors() if t.dim()), default=1)
    return sum(p.numel() for p in parameters) * tokens


def computes_by_default(model: nn.Module, parameters: Sequence[torch.Tensor], call: ModelCall, below_work: float = COMPUTE_BELOW_WORK,
                        pixels_per_token: int = PATCH_PIXELS) -> bool:
    """Whether to trace on real values unless asked otherwise (``parameters``: the model's):
    small calls (``below_work`` with images of ``pixels_per_token``, ``COMPUTE_BELOW_ELEMENTS``), where
    computing costs less than the meta trace's extra work, lazy modules, and recurrent layers, whose
    meta kernels are Python loops over the time steps (an LSTM of 32 steps: 480 ms on meta, 15 ms
    computed)."""
    if any(isinstance(p, UninitializedTensorMixin) for p in parameters):
        return True
    if any(isinstance(module, nn.RNNBase) for module in model.modules()):
        return True
    largest = max((t.numel() for t in call.tensors()), default=0)
    return estimated_work(parameters, call, pixels_per_token) < below_work and largest <= COMPUTE_BELOW_ELEMENTS


def _module_copy(module: nn.Module) -> nn.Module:
    """``copy.copy(module)``, without its generic machinery where the module's class copies as
    ``nn.Module`` does (a new object given the module's state): a third of a copy's time otherwise."""
    cls = type(module)
    if parametrize.is_parametrized(module):  # its class refuses copies (its getstate raises): its state is a module's all the same
        twin = cls.__new__(cls)
        twin.__dict__.update(vars(module))
        return twin
    if not _copies_as_module(cls):
        return copy.copy(module)
    twin = cls.__new__(cls)
    twin.__setstate__(module.__getstate__())
    return twin


@functools.lru_cache(maxsize=256)
def _copies_as_module(cls: type) -> bool:
    """Whether ``copy.copy`` copies a ``cls`` as it copies any ``nn.Module``: ``cls.__new__`` given the
    module's ``__getstate__`` (no copy hooks, reduction or constructor arguments of its own). Kept
    for a bounded number of classes: some are made per module (a parametrized module's)."""
    return (
        cls.__reduce_ex__ is object.__reduce_ex__ and cls.__reduce__ is object.__reduce__ and cls.__getstate__ is nn.Module.__getstate__
        and not hasattr(cls, "__copy__") and not hasattr(cls, "__getnewargs_ex__") and not hasattr(cls, "__getnewargs__")
        and cls not in copy._copy_dispatch and cls not in copyreg.dispatch_table
    )


def _calls_its_own(module: nn.Module, twin: nn.Module, copies: Mapping[nn.Module, nn.Module]) -> None:
    """Points what ``twin`` (the copy of ``module``) holds of ``module``'s own calls at the copy: a
    ``torch.compile`` wrapper's ``forward`` at the copy of the module it wraps (run eagerly); under
    accelerate's hook (a device map, offloading: a ``forward`` that brings the weights and inputs
    to the execution device, then calls the user's module), the class's ``forward``; a method
    bound to the module (``Accelerator.prepare``'s autocast ``forward``, a user's
    ``types.MethodType``), bound to the copy."""
    own = vars(module)
    if is_compiled(module):
        twin.__dict__.update({name: copies[module._modules["_orig_mod"]] for name in ("forward", "_forward") if name in own})
        return
    if "_hf_hook" in own:
        for name in ("forward", "_old_forward", "_hf_hook"):
            twin.__dict__.pop(name, None)
        return
    twin.__dict__.update({name: types.MethodType(value.__func__, twin) for name, value in own.items() if isinstance(value, types.MethodType) and value.__self__ is module})


def empty_copy(model: nn.Module, call: ModelCall, device: str = "meta", fake_mode: Optional[FakeTensorMode] = None) -> tuple[nn.Module, ModelCall, dict[nn.Module, nn.Module]]:
    """A copy of ``model`` whose parameters and buffers are tensors without values on ``device``
    (meta: no memory either; with ``fake_mode``, its fake tensors of ``device``), the call with
    such inputs, and each of the model's modules mapped to its copy.

    The copy shares everything else with the model (code, attributes, hooks): it is made module by
    module with ``copy.copy`` and new parameter, buffer and child tables. The user's model is not
    touched, so other threads may keep using it while the copy is traced. The copy also has its own
    tables of hooks (the user's hooks in them), since what runs on it may register more (FSDP2,
    tensor parallelism, activation checkpointing). What calls the user's module instead of its
    copy is pointed at the copy (:func:`_calls_its_own`).
    """
    return _copy(model, call, _without_values(device, fake_mode))


def valued_copy(model: nn.Module, call: ModelCall) -> tuple[nn.Module, ModelCall]:
    """:func:`empty_copy` with the values: each parameter, buffer and input cloned, for a step that
    reads values (and an optimizer that writes them) to run on, the user's model untouched."""
    twin, twin_call, _ = _copy(model, call, _with_values)
    return twin, twin_call


def _copy(model: nn.Module, call: ModelCall, make: Callable[[torch.Tensor], torch.Tensor]) -> tuple[nn.Module, ModelCall, dict[nn.Module, nn.Module]]:
    """The copy of :func:`empty_copy`, its tensors made by ``make``."""
    swapped: dict[Hashable, torch.Tensor] = {}
    keys = value_keys(model)
    copies: dict[nn.Module, nn.Module] = {}
    pending = [model]
    while pending:  # every module once, shared ones too
        module = pending.pop()
        if isinstance(module, torch.jit.ScriptModule):
            name = next(name for name, each in model.named_modules() if each is module)
            raise JitflopsError(f"{f'module {name!r}' if name else 'the model'} is {SCRIPTED}: estimate the model with the module unscripted")
        if module not in copies:
            copies[module] = _module_copy(module)
            pending.extend(child for child in module._modules.values() if child is not None)
    for module, twin in copies.items():
        twin.__dict__["_parameters"] = {name: None if p is None else _twin_tensor(p, make, swapped, keys) for name, p in module._parameters.items()}
        twin.__dict__["_buffers"] = {name: None if b is None else _twin_tensor(b, make, swapped, keys) for name, b in module._buffers.items()}
        twin.__dict__.update({name: copy.copy(value) for name, value in vars(module).items() if name.endswith("hooks") or name.endswith("hooks_with_kwargs") or name.endswith("always_called")})
        twin.__dict__["_modules"] = {name: None if child is None else copies[child] for name, child in module._modules.items()}
        _calls_its_own(module, twin, copies)
    twin = copies[model]
    leaves, spec = pytree.tree_flatten((call.args, call.kwargs))
    args, kwargs = pytree.tree_unflatten([_twin_tensor(leaf, make, swapped, keys) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec)
    return twin, ModelCall(args, kwargs), copies


def holds_meta(parameters: Sequence[torch.Tensor], call: ModelCall) -> bool:
    """Whether the model (``parameters``: its) or the call is on the meta device."""
    return any(t.is_meta for t in [*parameters, *call.tensors()])


def holds_values(model: nn.Module, call: ModelCall) -> bool:
    """Whether the model's parameters and buffers and the call's tensors all have values (none is on meta)."""
    return not holds_meta([*model.parameters(), *model.buffers()], call)


def built_on_meta(model: nn.Module) -> bool:
    """Whether ``model`` has parameters on the meta device: built under ``torch.device("meta")`` or
    accelerate's ``init_empty_weights`` (which leaves the buffers on the CPU), with no values to run
    on. Some of its tensors may be elsewhere (:func:`counted_on_meta`)."""
    return any(p.is_meta for p in model.parameters())


def counted_on_meta(model: nn.Module, call: ModelCall) -> tuple[nn.Module, ModelCall]:
    """The model and the call a count of ``model`` on ``call`` runs. Where the model is
    :func:`built_on_meta` but holds parameters or buffers on another device, a copy whose tensors
    are all on meta (:func:`empty_copy`), and the call's: transformers leaves one on the CPU in 29
    of 631 architectures built under ``torch.device("meta")`` (the legacy ``torch.Tensor(n)``
    ignores the default device: wav2vec2's ``masked_spec_embed``, XLNet's attention weights,
    Mask2Former's ``level_embed``), and their forwards would mix the devices. So too where its ties
    were broken (:func:`~jitflops.core.tied_weights.has_broken_ties`): the copy ties them again, and
    a backward accumulates their gradients as the loaded model's does. Else the model itself,
    on :func:`on_the_models_meta_device` of the call."""
    if built_on_meta(model) and (has_broken_ties(model) or not all(t.is_meta for t in [*model.parameters(), *model.buffers()])):
        twin, twin_call, _ = empty_copy(model, call)
        return twin, twin_call
    return model, on_the_models_meta_device(model, call)


def on_the_models_meta_device(model: nn.Module, call: ModelCall) -> ModelCall:
    """``call`` with its tensors on the meta device where ``model`` is :func:`built_on_meta` and some
    of the call's tensors are not: made as users make inputs, with ``torch.randint`` and
    ``torch.randn`` on the CPU. The forward would mix the devices (a ViT's patch convolution refuses
    a CPU image, BERT's loss CPU labels). No value is lost that a count on meta reads: it reads none
    (explicit masks count dense there)."""
    if not built_on_meta(model) or all(t.is_meta for t in call.tensors()):
        return call
    args, kwargs = pytree.tree_map_only(torch.Tensor, lambda t: t.detach().to("meta").requires_grad_(t.requires_grad), (call.args, call.kwargs))
    return ModelCall(args, kwargs)


META_VALUE_READS = ("cannot be called on meta tensors", "Cannot copy out of meta tensor", "with Meta tensors", "data-independent implementation does not exist",
                    "repeat_interleave a meta tensor without output_size")
"""What torch's meta kernels say when a value is read from a meta tensor: ``item()`` and ``bool()``,
``tolist()``, ``torch.equal``, ``nonzero``, ``repeat_interleave`` of counts (Qwen-VL's vision towers)."""


READS_A_VALUE = ("its forward reads a value, which no tensor on the meta device has (jitflops never allocates them): count the model built "
                 "on the CPU, whose call is traced on a meta copy where it can be, and on its values where it reads them")
"""What to do about a model on the meta device whose forward reads a value (:func:`reads_a_meta_value`)."""


READS_A_FAKE_VALUE = ("its forward reads a tensor's value (.item(), .tolist(), a loss's lengths), which fake tensors (an estimate's, a count in "
                      "symbolic sizes) do not have: leave out the input whose values it reads (a CTC loss's labels), or measure the model running")
"""What to do about a forward on fake tensors that reads a value (:func:`reads_a_fake_value`)."""


def reads_a_fake_value(error: Optional[BaseException]) -> bool:
    """Whether ``error`` is a fake tensor's refusal to give a value, or a size that depends on one."""
    return isinstance(error, (DataDependentOutputException, DynamicOutputShapeException))


def reads_a_meta_value(error: Optional[BaseException]) -> bool:
    """Whether ``error`` is a meta tensor's refusal to give a value (it has none)."""
    return isinstance(error, (RuntimeError, NotImplementedError)) and any(words in str(error) for words in META_VALUE_READS)


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
