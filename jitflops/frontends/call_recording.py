"""A JIT count without the tracer: the model's torch calls.

A count under the default conventions reads few of a JIT graph's nodes: those its handles count
(products, convolutions, norms, pools, attention). Every other node is an op it ignores, and
matters only as a sign that its module ran (fvcore's rule for uncalled modules). A
``TorchFunctionMode`` sees each torch call as Python makes it, which is the op the tracer records
at that place; global module hooks give each call its module scope, and what Python can ask of the
tracer answers as under it. One forward under both (on a meta copy of the model, or on its values
where the call is small) gives the records of the trace for the cost of that forward: what made
small models cost more to count than to run was the tracer's own work per node (a source range
walked from the whole Python stack for every node, constants included).

Only calls whose nodes are known are taken: :data:`COUNTED_CALLS` (with how a call's arguments
become its node's) and :data:`FREE_CALLS` (the ops each records, which the count must ignore).
Anything else ends the recording with None, and the JIT traces the model as before: another call;
reading a tensor's value where it may be the inputs' data (:data:`VALUE_READS`); an op the analysis
counts without a shape formula or does not know; a module hook; a module of the model the analysis
has no name for; a custom autograd Function; a scripted function. A module outside the model (a
function the ``kernels`` package made a module, as transformers 5.25's ``apply_rotary_pos_emb``)
opens no scope, as under the tracer. The JIT alone warns of control flow that depends on values,
and records what it alone records. ``tests/test_call_recording.py`` compares the two on every model
of the zoo and traces each call of both tables.
"""

from __future__ import annotations

import logging
import threading
import types
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterator, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as module_globals
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode

from ..core.model_guard import preserved, preserved_through_copy
from ..core.model_io import ModelCall
from ..core.records import EagerOpRecord, TensorMeta, argument_names
from ..core.running_module import module_names
from ..handles.registry import ShapeFormula
from .dispatch_trace import DispatchTrace
from ..core.imported_classes import is_compiled
from .meta_values import call_blocker, empty_copy, holds_meta, meta_kernels_for_tracing, module_blocker
from .traced_path import on_the_traced_path

logger = logging.getLogger(__name__)


def _meta(value: Any) -> Any:
    """A tensor argument as the JIT's record holds it (shape and dtype); anything else as it is."""
    return TensorMeta(tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else value


def _sizes(value: Any, dims: int) -> list[Any]:
    """An ``int[dims]`` argument as the node holds it: a single int repeated."""
    return list(value) if isinstance(value, (list, tuple)) else [value] * dims


class _NotTaken(Exception):
    """A call outside the tables: the JIT traces the model instead."""


def _convolution(dims: int) -> Callable[..., list[Any]]:
    """``conv1d``/``conv2d``/``conv3d`` as the node the tracer records for them, ``aten::_convolution``."""

    def arguments(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> list[Any]:
        if isinstance(padding, str):  # recorded as aten::_convolution_mode
            raise _NotTaken("a convolution with padding given by name")
        return [_meta(input), _meta(weight), _meta(bias), _sizes(stride, dims), _sizes(padding, dims), _sizes(dilation, dims), False, [0] * dims, groups, False, False, True, True]

    return arguments


def _linear(input: Any, weight: Any, bias: Any = None) -> list[Any]:
    return [_meta(input), _meta(weight), _meta(bias)]


def _batch_norm(input: Any, running_mean: Any, running_var: Any, weight: Any = None, bias: Any = None, training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> list[Any]:
    return [_meta(input), _meta(weight), _meta(bias), _meta(running_mean), _meta(running_var), training, momentum, eps, True]


def _layer_norm(input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> list[Any]:
    return [_meta(input), list(normalized_shape), _meta(weight), _meta(bias), eps, True]


def _group_norm(input: Any, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> list[Any]:
    return [_meta(input), num_groups, _meta(weight), _meta(bias), eps, True]


def _adaptive_pool(dims: int) -> Callable[..., list[Any]]:
    def arguments(input: Any, output_size: Any) -> list[Any]:
        sizes = _sizes(output_size, dims)
        return [_meta(input), [input.shape[-dims + index] if size is None else size for index, size in enumerate(sizes)]]

    return arguments


def _max_pool2d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False) -> list[Any]:
    if return_indices:  # recorded as aten::max_pool2d_with_indices
        raise _NotTaken("a max pool that returns its indices")
    return [_meta(input), _sizes(kernel_size, 2), [] if stride is None else _sizes(stride, 2), _sizes(padding, 2), _sizes(dilation, 2), ceil_mode]


def _attention(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> list[Any]:
    return [_meta(query), _meta(key), _meta(value), _meta(attn_mask), dropout_p, is_causal, scale, enable_gqa]


def _product(input: Any, other: Any) -> list[Any]:
    return [_meta(input), _meta(other)]


def _addmm(input: Any, mat1: Any, mat2: Any, *, beta: Any = 1, alpha: Any = 1) -> list[Any]:
    return [_meta(input), _meta(mat1), _meta(mat2), beta, alpha]


COUNTED_CALLS: dict[Callable[..., Any], tuple[str, Callable[..., list[Any]]]] = {
    torch.conv1d: ("aten::_convolution", _convolution(1)),
    torch.conv2d: ("aten::_convolution", _convolution(2)),
    torch.conv3d: ("aten::_convolution", _convolution(3)),
    F.linear: ("aten::linear", _linear),
    F.batch_norm: ("aten::batch_norm", _batch_norm),
    F.layer_norm: ("aten::layer_norm", _layer_norm),
    F.group_norm: ("aten::group_norm", _group_norm),
    torch.adaptive_avg_pool1d: ("aten::adaptive_avg_pool1d", _adaptive_pool(1)),
    F.adaptive_avg_pool2d: ("aten::adaptive_avg_pool2d", _adaptive_pool(2)),
    F.max_pool2d: ("aten::max_pool2d", _max_pool2d),
    F.scaled_dot_product_attention: ("aten::scaled_dot_product_attention", _attention),
    torch.matmul: ("aten::matmul", _product),
    torch.Tensor.matmul: ("aten::matmul", _product),
    torch.Tensor.__matmul__: ("aten::matmul", _product),
    torch.bmm: ("aten::bmm", _product),
    torch.Tensor.bmm: ("aten::bmm", _product),
    torch.addmm: ("aten::addmm", _addmm),
}
"""Calls the default counts count, each with the kind of the node the tracer records for it and
how its arguments become that node's (in the order of the op's schema)."""

SILENT: tuple[str, ...] = ()
"""The kinds of a call that records no node: the tracer reads it and moves on (``x.dim()``, a
tensor's dtype or device). ``torch.tensor`` of data records a constant, which is a node: its
module is called."""

_ELEMENTWISE = (
    "abs", "add", "add_", "ceil", "clamp", "cos", "div", "div_", "eq", "erf", "exp", "floor", "ge", "gelu", "gt", "isnan",
    "le", "log", "logical_not", "lt", "masked_fill", "masked_fill_", "maximum", "minimum", "mul", "mul_", "ne", "neg", "pow",
    "floor_divide", "reciprocal", "relu", "relu_", "remainder", "round", "rsqrt", "sigmoid", "sign", "sin", "sqrt", "sub",
    "sub_", "tanh", "where",
)
_SHAPES = (
    "cat", "chunk", "clone", "contiguous", "detach", "expand", "expand_as", "flatten", "flip", "index_select", "narrow",
    "permute", "repeat", "repeat_interleave", "reshape", "roll", "squeeze", "stack", "t", "transpose", "tril", "triu",
    "unbind", "unsqueeze", "view", "view_as",
)
_MADE = ("arange", "full_like", "new_ones", "new_zeros", "ones", "ones_like", "zeros", "zeros_like")
_REDUCTIONS = ("all", "any", "argmax", "cumsum", "diff", "gather", "log_softmax", "max", "mean", "min", "sum")

FREE_CALLS: dict[str, tuple[str, ...]] = {
    **{name: (f"aten::{name}",) for name in _ELEMENTWISE + _SHAPES + _MADE + _REDUCTIONS},
    "__add__": ("aten::add",), "__radd__": ("aten::add",), "__iadd__": ("aten::add_",), "__sub__": ("aten::sub",),
    "__mul__": ("aten::mul",), "__rmul__": ("aten::mul",), "__imul__": ("aten::mul_",), "__truediv__": ("aten::div",),
    "__neg__": ("aten::neg",), "__eq__": ("aten::eq",), "__ne__": ("aten::ne",), "__lt__": ("aten::lt",), "__le__": ("aten::le",),
    "__gt__": ("aten::gt",), "__ge__": ("aten::ge",), "__pow__": ("aten::pow",), "__and__": ("aten::__and__",),
    "__or__": ("aten::__or__",), "__invert__": ("aten::bitwise_not",),
    "__rsub__": ("aten::rsub",), "__getitem__": ("aten::slice", "aten::select", "aten::unsqueeze", "aten::index"),
    "numel": ("aten::numel",),
    "__mod__": ("aten::remainder",), "__rmod__": ("aten::remainder",), "__floordiv__": ("aten::floor_divide",),
    "__rfloordiv__": ("aten::floor_divide",),
    "__rtruediv__": ("aten::reciprocal", "aten::mul"),
    "to": ("aten::to",), "float": ("aten::to",), "long": ("aten::to",), "bool": ("aten::to",), "half": ("aten::to",),
    "type_as": ("aten::type_as",),
    "size": ("aten::size",), "shape": ("aten::size",),
    "split": ("aten::split",), "dropout": ("aten::dropout",), "embedding": ("aten::embedding",), "pad": ("aten::pad",),
    "hardtanh": ("aten::hardtanh", "aten::hardtanh_"), "silu": ("aten::silu", "aten::silu_"), "softmax": ("aten::softmax",),
    "cross_entropy": ("aten::cross_entropy_loss",),
    "tensor": ("prim::Constant",), "dim": SILENT, "ndim": SILENT, "dtype": SILENT, "device": SILENT,
}
"""Calls the default counts ignore, by name (a tensor method, a torch function, a property, an
operator), with the kinds of the nodes the tracer records for them (none: :data:`SILENT`). A
call is taken only where each kind is one the analysis ignores (``prim::`` nodes are no ops: a
tensor made of data is a constant)."""

VALUE_READS = frozenset({"__bool__", "__int__", "__index__", "__float__", "item", "tolist"})
"""Calls that turn a tensor's values into Python values: the tracer records no node for them (the
value is a constant of the trace; an op that takes the tensor itself records ``aten::Int`` where it
is, beside its own node). They are taken only on a meta copy of the model, and only of a tensor that
is not meta: there every tensor made from the model's inputs and parameters is meta, so a tensor
with values was made of constants and sizes in the forward (``torch.tensor(input_resolution)``,
which transformers' Swin makes when it is traced), and reading it is shape arithmetic, which the
trace follows without a warning. Elsewhere a value may come from the inputs' data, which only the
trace tells apart (:mod:`jitflops.frontends.data_dependence`)."""

DROPPED_WHEN_UNUSED = frozenset({"size", "shape", "numel", "split", "chunk", "unbind"})
"""Calls that give sizes or lists of tensors: the trace keeps their nodes only where what they give
is used, so where a module and the modules inside it ran nothing else, whether the JIT finds it
called is not known here, and the model is traced."""

_PYTHON_FREE_CALLS: dict[Callable[..., Any], str] = {
    F.dropout: "dropout", F.embedding: "embedding", F.pad: "pad", F.hardtanh: "hardtanh", F.relu: "relu", F.silu: "silu",
    F.softmax: "softmax", F.cross_entropy: "cross_entropy", torch.Tensor.split: "split", torch.Tensor.__rsub__: "__rsub__", torch.Tensor.__rmod__: "__rmod__",
    torch.Tensor.__floordiv__: "__floordiv__", torch.Tensor.__rfloordiv__: "__rfloordiv__", torch.Tensor.__rtruediv__: "__rtruediv__",
}
"""The Python functions among :data:`FREE_CALLS`: what they call is not seen (the mode is off
while a call it handles runs), so they are known by identity, not by name."""

_BUILTINS = (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType, types.MethodWrapperType)


def _free_call_name(func: Any) -> Optional[str]:
    """The name under which ``func`` may be in :data:`FREE_CALLS` (None: it is not a torch builtin)."""
    python = _PYTHON_FREE_CALLS.get(func)
    if python is not None:
        return python
    if isinstance(func, _BUILTINS):
        name = func.__name__
        if name == "__get__":  # a tensor's property
            return getattr(func.__self__, "__name__", None)
        return name
    return None


@dataclass(frozen=True)
class CallTrace(DispatchTrace):
    """The counted calls of one forward, each with its full scope path, as the dispatch front end
    keeps its ops, and every scope in which a call recorded a node: a call the count ignores still
    says that its module ran, as the JIT trace's node does."""

    ran_in: tuple[str, ...] = ()

    def scopes(self) -> Iterator[str]:
        return iter(self.ran_in)


def _argument(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


Writer = Callable[[tuple, dict], tuple[Any, ...]]
"""The tensors a call is about to write, from its arguments."""


def _self_written(args: tuple, kwargs: dict) -> tuple[Any, ...]:
    return (args[0],)


def _input_if_inplace(index: int) -> Writer:
    def written(args: tuple, kwargs: dict) -> tuple[Any, ...]:
        return (args[0],) if _argument(args, kwargs, index, "inplace") else ()

    return written


def _running_statistics(args: tuple, kwargs: dict) -> tuple[Any, ...]:
    if not _argument(args, kwargs, 5, "training"):
        return ()
    return tuple(tensor for tensor in (_argument(args, kwargs, 1, "running_mean"), _argument(args, kwargs, 2, "running_var")) if tensor is not None)


def _renormalised_weight(args: tuple, kwargs: dict) -> tuple[Any, ...]:
    return (_argument(args, kwargs, 1, "weight"),) if _argument(args, kwargs, 3, "max_norm") is not None else ()


_WRITERS: dict[Callable[..., Any], Writer] = {
    F.hardtanh: _input_if_inplace(3), F.relu: _input_if_inplace(1), F.silu: _input_if_inplace(1), F.dropout: _input_if_inplace(3),
    F.batch_norm: _running_statistics, F.embedding: _renormalised_weight,
}
"""Calls of the tables that write a tensor they are given: where ``inplace`` is set, a batch norm's
running statistics in training, an embedding's weight it renormalises (``max_norm``)."""


def _writer(func: Any, name: Optional[str]) -> Optional[Writer]:
    """What a call of ``func`` (of the free name ``name``) writes: an in-place method's ``self``, or
    what :data:`_WRITERS` says; None: nothing."""
    if name is not None and ((name.endswith("_") and not name.startswith("__")) or name in ("__iadd__", "__imul__")):
        return _self_written
    return _WRITERS.get(func)


Handler = Callable[["_CallRecorder", tuple, dict], Any]
"""How the recorder takes a call of one function: it runs it (and records it) or raises :class:`_NotTaken`.
Given the recorder, not holding it: a recorder holding closures over itself would be a reference
cycle, and would keep the model's snapshot (and a meta copy of the model) until Python's cyclic
collector ran."""


def _counted(func: Any, kind: str, arguments: Callable[..., list[Any]], writer: Optional[Writer]) -> Handler:
    """A counted call: recorded as the node the tracer records for it."""

    def counted(recorder: _CallRecorder, args: tuple, kwargs: dict) -> Any:
        values = arguments(*args, **kwargs)
        names = argument_names(kind, len(values))
        if names is None:
            raise _NotTaken(f"{kind}'s overloads of {len(values)} arguments name them differently")
        if writer is not None:
            for tensor in writer(args, kwargs):
                recorder.before_write(tensor)
        output = func(*args, **kwargs)
        path = recorder.paths[-1]
        recorder.records.append((path, EagerOpRecord(kind, values, [_meta(output)], names, path.rpartition("/")[2])))
        recorder.ran_in[path] = None
        return output

    return counted


def _value_read(func: Any, name: str) -> Handler:
    """A read of a tensor's values on a meta copy: taken only of a tensor of constants, one that is
    not meta (:data:`VALUE_READS`)."""

    def read(recorder: _CallRecorder, args: tuple, kwargs: dict) -> Any:
        if args[0].is_meta:
            raise _NotTaken(f"{name} reads a meta tensor's values, which may be the inputs' data")
        return func(*args, **kwargs)

    return read


def _free(func: Any, writer: Optional[Writer], dropped_when_unused: bool, records_nodes: bool) -> Handler:
    """A call the count ignores: it says only that its module ran (where it records a node)."""

    def free(recorder: _CallRecorder, args: tuple, kwargs: dict) -> Any:
        if dropped_when_unused:
            recorder.maybe_ran_in.add(recorder.paths[-1])
        elif records_nodes:
            recorder.ran_in[recorder.paths[-1]] = None
        if writer is not None:
            for tensor in writer(args, kwargs):
                recorder.before_write(tensor)
        return func(*args, **kwargs)

    return free


def _refusal(reason: str) -> Handler:
    def refuse(recorder: _CallRecorder, args: tuple, kwargs: dict) -> Any:
        raise _NotTaken(reason)

    return refuse


class _CallRecorder(TorchFunctionMode):
    """Records the counted calls and the scopes calls ran in; raises :class:`_NotTaken` at any other
    call. Hands the model's snapshot each tensor a call is about to write (``before_write``), so that
    it copies values only where the forward writes them. What to do with a function is decided at its
    first call (:meth:`_handler`) and kept: a forward calls a few functions many times."""

    def __init__(self, handles: Mapping[str, Any], ignored: Collection[str], before_write: Callable[[torch.Tensor], None], on_meta_copy: bool) -> None:
        super().__init__()
        self.handles = handles
        self.ignored = ignored
        self.before_write = before_write
        self.on_meta_copy = on_meta_copy
        self.paths = [""]
        self.records: list[tuple[str, EagerOpRecord]] = []
        self.ran_in: dict[str, None] = {}
        self.maybe_ran_in: set[str] = set()
        self._handlers: dict[Any, Handler] = {}

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if "out" in kwargs:
            raise _NotTaken("a call that writes an out= argument")
        handler = self._handlers.get(func)
        if handler is None:
            handler = self._handlers[func] = self._handler(func)
        return handler(self, args, kwargs)

    def _handler(self, func: Any) -> Handler:
        rule = COUNTED_CALLS.get(func)
        if rule is not None:
            kind, arguments = rule
            if not isinstance(self.handles.get(kind), ShapeFormula):
                return _refusal(f"{kind} has no shape formula here")
            return _counted(func, kind, arguments, _writer(func, None))
        name = _free_call_name(func)
        if name in VALUE_READS:
            return _value_read(func, name) if self.on_meta_copy else _refusal(f"{name} reads a tensor's values, which may be the inputs' data")
        kinds = FREE_CALLS.get(name) if name is not None else None
        if kinds is None or any((kind not in self.ignored or kind in self.handles) and not kind.startswith("prim::") for kind in kinds):
            return _refusal(f"{getattr(func, '__qualname__', func)} is not a call whose nodes are known")
        return _free(func, _writer(func, name), name in DROPPED_WHEN_UNUSED, bool(kinds))


def _not_taken_before(model: nn.Module, call: ModelCall, names: Mapping[nn.Module, str]) -> Optional[str]:
    """Why the calls of ``model`` cannot be recorded, known before it runs (None: they may be). One
    pass over the modules: each pass costs about 0.3 ms on MobileNetV2's 211."""
    if module_globals._global_forward_hooks or module_globals._global_forward_pre_hooks:
        return "global module hooks are set"
    if nn.Module.__call__ is not getattr(nn.Module, "_wrapped_call_impl", nn.Module.__call__):
        return "nn.Module.__call__ is another tool's"
    for module in model.modules():
        name = names.get(module)
        if name is None:
            return f"a {type(module).__name__} has no name"
        if module._forward_hooks or module._forward_pre_hooks:
            return f"{name or 'the model'} has hooks (the JIT scopes what they run differently)"
        if isinstance(module, (nn.RNNBase, torch.jit.ScriptModule, nn.DataParallel, nn.parallel.DistributedDataParallel)) or is_compiled(module):
            return f"{name or 'the model'} is a {type(module).__name__}"
        blocker = module_blocker(name, module)
        if blocker is not None:
            return blocker
    return call_blocker(call)


@contextmanager
def _as_under_the_tracer(recording: int) -> Iterator[None]:
    """For the body, in the thread ``recording``, what Python can ask of the tracer answers as under
    it: ``torch.jit.is_tracing()`` is True (:func:`~jitflops.frontends.traced_path.on_the_traced_path`).
    And calls whose ops no torch function mode sees, which the tracer records as one node (or fails
    on), stop the recording: a custom autograd Function (``prim::PythonOp``) and a scripted function
    or method (``prim::CallFunction``). Other threads get torch's own. Called under
    :data:`~jitflops.core.model_guard.RECORDING_LOCK`."""
    apply = vars(torch.autograd.Function)["apply"]
    scripted = [(kind, vars(kind)["__call__"]) for kind in (torch._C.ScriptFunction, torch._C.ScriptMethod)]

    def refused(what: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def refusing(owner: Any, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == recording:
                raise _NotTaken(f"{getattr(owner, '__name__', what)} is a {what}")
            return call(owner, *args, **kwargs)

        return refusing

    def apply_to(cls: type, *args: Any, **kwargs: Any) -> Any:
        """``Function.apply`` as torch defines it: a Python classmethod, or one of C++ (torch 2.14)."""
        return apply.__get__(None, cls)(*args, **kwargs)

    torch.autograd.Function.apply = classmethod(refused("custom autograd Function", apply_to))
    for kind, call in scripted:
        kind.__call__ = refused("scripted function", call)
    try:
        with on_the_traced_path():
            yield
    finally:
        torch.autograd.Function.apply = apply
        for kind, call in scripted:
            kind.__call__ = call


def _ran_within(path: str, ran_in: Collection[str]) -> bool:
    """Whether a node was recorded in the scope ``path`` or in a scope inside it (which makes its
    module called for the JIT too)."""
    return path in ran_in or any(scope.startswith(f"{path}/") for scope in ran_in)


def record_calls(
    model: nn.Module, call: ModelCall, aliases: Mapping[Any, str], handles: Mapping[str, Any], ignored: Collection[str], on_meta_copy: bool
) -> Optional[CallTrace]:
    """The JIT trace's records of ``model`` called with ``call``, for an analysis with ``handles`` that
    ignores the kinds ``ignored``, read from its calls: on a meta copy where ``on_meta_copy``, on its
    own values otherwise (a small call computes faster than a meta copy is made, and runs no meta
    kernel, whose first use imports sympy). None where they cannot be read (the reason is logged at
    debug level): the JIT traces."""
    names = module_names(aliases)
    reason = _not_taken_before(model, call, names)
    if reason is not None:
        logger.debug("traced: %s", reason)
        return None
    recording = threading.get_ident()

    def enter(module: nn.Module, inputs: Any) -> None:
        if threading.get_ident() != recording:  # another thread's module
            return
        name = names.get(module)
        if name is not None:  # a module outside the model opens no scope
            recorder.paths.append(f"{recorder.paths[-1]}/{name}" if name else recorder.paths[-1])

    def leave(module: nn.Module, inputs: Any, output: Any) -> None:
        if module in names and threading.get_ident() == recording:
            recorder.paths.pop()

    try:
        if on_meta_copy:  # a copy that fails here is traced, as any failure here
            model, call, copies = empty_copy(model, call)
            names = {copies[module]: name for module, name in names.items()}
        with (
            preserved_through_copy(model) if on_meta_copy else preserved(model, values_on_write=True) as snapshot, _as_under_the_tracer(recording),
            meta_kernels_for_tracing() if on_meta_copy or holds_meta(list(model.parameters()), call) else nullcontext(), torch.no_grad(),
        ):
            recorder = _CallRecorder(handles, ignored, snapshot.save_before_write, on_meta_copy)
            entering, leaving = register_module_forward_pre_hook(enter), register_module_forward_hook(leave)
            try:
                with recorder:
                    model(*call.args, **call.kwargs)
            finally:
                entering.remove()
                leaving.remove()
    except Exception as error:  # the JIT traces it (an interrupt is not caught)
        logger.debug("traced: recording the calls stopped: %s", error)
        return None
    if any(not _ran_within(path, recorder.ran_in) for path in recorder.maybe_ran_in):
        logger.debug("traced: a module ran only calls whose nodes the trace may drop")
        return None
    return CallTrace(tuple(recorder.records), ran_in=tuple(recorder.ran_in))
