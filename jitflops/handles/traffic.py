"""Bytes each op reads and writes: its compulsory memory traffic, as if it ran as one kernel.

* Each tensor the op takes is read once and each tensor it returns written once, at its dtype's
  width (float32 4, bfloat16 2, float8 1, sub-byte types such as ``uint4`` their bits / 8), and a
  broadcast input at its own size: :func:`tensor_traffic`, every op's count unless its family's
  formula below says otherwise (:class:`TrafficFormulas`). A 0-dim tensor is a scalar a kernel
  takes as an argument, not traffic (and under the JIT, traced size arithmetic).
* Views, reshapes and other metadata-only ops move nothing (:data:`METADATA_OPS`), and so do
  identities at run time: dropout when not training, a cast to the dtype a tensor already has. A
  copy made only to change the layout (``contiguous``, a ``reshape`` that cannot be a view: a
  ``clone`` to the contiguous format where the dispatch backend sees it) moves nothing either: a
  kernel can read the strided tensor as it is, and whether eager code copies depends on the layout
  the kernel before it chose (SDPA's CPU and CUDA kernels write (batch, sequence, heads, dim), so
  the usual ``transpose(1, 2).contiguous()`` after them copies nothing), which a trace on meta
  tensors does not see.
* An in-place op reads and writes its target: its output is the target, read as an input.
* Gathers read the rows they use (the index, and as many source elements as they return), not
  the table: ``embedding``, ``embedding_bag``, ``index_select``, ``gather``, ``index``, ``take``.
* Fused ops count their own inputs and outputs, not an unfused decomposition's; statistics a
  kernel keeps for the backward (a norm's mean and inverse deviation, attention's log-sum-exp,
  max pooling's indices) are not part of the forward's result, so only the first output is
  written (:data:`FIRST_OUTPUT_ONLY`): the JIT's ``layer_norm`` and the dispatch backend's
  ``native_layer_norm`` then move the same bytes.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Mapping, Optional

import torch

from ..core.records import OpRecord, TensorMeta
from .registry import FormulaTable, Handle, ShapeFormula
from .zero_cost import aten_kinds


METADATA_OPS: frozenset[str] = aten_kinds(
    # scalars and sizes
    "Int Float Bool ScalarImplicit size numel dim item _local_scalar_dense sym_size sym_numel sym_stride is_same_size "
    "_has_compatible_shallow_copy_type "
    # views: a new shape, strides or offset over the same storage
    "view view_as reshape reshape_as _reshape_alias _unsafe_view flatten unflatten squeeze squeeze_ unsqueeze unsqueeze_ contiguous "
    "permute transpose transpose_ t t_ numpy_T mT mH adjoint matrix_H expand expand_as alias as_strided as_strided_ diagonal "
    "movedim moveaxis swapaxes swapdims view_as_real view_as_complex narrow select slice split split_with_sizes unsafe_split "
    "chunk unsafe_chunk tensor_split unbind unfold broadcast_to broadcast_tensors real imag positive _neg_view _conj "
    "resolve_conj resolve_neg linalg_diagonal "
    "detach detach_ lift_fresh hsplit vsplit dsplit atleast_1d atleast_2d atleast_3d ravel "
    # memory handed out without being written, and flags
    "empty empty_like empty_strided empty_permuted new_empty new_empty_strided requires_grad_ set_ resize_ resize_as_"
) | frozenset({"_c10d_functional::_wrap_tensor_autograd", "_c10d_functional::wait_tensor"})
"""Ops that move no data: sizes, views and allocations, and a collective's hand-over of its result."""

FIRST_OUTPUT_ONLY: frozenset[str] = aten_kinds(
    "native_layer_norm native_batch_norm _native_batch_norm_legit _native_batch_norm_legit_no_training "
    "_native_batch_norm_legit_functional native_group_norm _fused_rms_norm cudnn_batch_norm miopen_batch_norm "
    "_scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_efficient_attention "
    "_scaled_dot_product_cudnn_attention _flash_attention_forward _efficient_attention_forward "
    "max_pool1d_with_indices max_pool2d_with_indices max_pool3d_with_indices adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d"
)
"""Ops whose outputs after the first are statistics kept for the backward: the fused forward's
result is the first output."""

_SUB_BYTE_BITS = {getattr(torch, name): bits for name, bits in (
    *((f"uint{bits}", bits) for bits in range(1, 8)), *((f"int{bits}", bits) for bits in range(1, 8)), ("quint4x2", 4), ("quint2x4", 2),
) if hasattr(torch, name)}


def dtype_bytes(dtype: Optional[torch.dtype]) -> float:
    """Bytes per element of ``dtype``: its width, a fraction for sub-byte types (4 where unknown)."""
    if dtype is None:
        return 4.0
    bits = _SUB_BYTE_BITS.get(dtype)
    return bits / 8 if bits is not None else float(dtype.itemsize)


def tensor_bytes(meta: Any) -> int:
    """The bytes a tensor holds (0 for anything that is not a tensor with a known shape, and for a
    0-dim tensor: a scalar)."""
    if not isinstance(meta, TensorMeta) or not meta.shape:
        return 0
    return math.ceil(math.prod(meta.shape) * dtype_bytes(meta.dtype))


def _tensors(values: Any) -> Iterator[TensorMeta]:
    """The tensors among ``values``, lists of tensors (``cat``'s, ``index``'s) included."""
    for value in values:
        if isinstance(value, TensorMeta):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)


def read_bytes(op: OpRecord) -> int:
    return sum(tensor_bytes(tensor) for tensor in _tensors(op.inputs))


def tensor_traffic(op: OpRecord) -> int:
    """Every tensor the op takes read once, every tensor it returns written once."""
    outputs = op.outputs[:1] if op.kind in FIRST_OUTPUT_ONLY else op.outputs
    return read_bytes(op) + sum(tensor_bytes(tensor) for tensor in _tensors(outputs))


BYTES_FORMULAS = FormulaTable("bytes read and written")
"""The op families whose traffic is not :func:`tensor_traffic`: gathers, run-time identities."""


def _gathered(op: OpRecord, index: Any, source: Any) -> int:
    """A gather: the index read, as many source elements read as it returns (at most the whole
    source, where indices repeat), its output written."""
    output = op.outputs[0]
    rows = min(tensor_bytes(output) // max(dtype_bytes(output.dtype), 1) * dtype_bytes(source.dtype), tensor_bytes(source)) if isinstance(output, TensorMeta) else 0
    return sum(tensor_bytes(tensor) for tensor in _tensors([index])) + math.ceil(rows) + tensor_bytes(output)


@BYTES_FORMULAS.register("aten::embedding", "aten::index_select", "aten::gather", "aten::take", "aten::take_along_dim", "aten::index")
def gather_bytes(op: OpRecord) -> int:
    names = op.arg_names or ()
    source = op.arg("weight") if "weight" in names else op.input(0)
    index = next((op.arg(name) for name in ("indices", "index") if name in names), op.input(1))
    return _gathered(op, index, source)


@BYTES_FORMULAS.register("aten::split_copy", "aten::split_with_sizes_copy", "aten::unbind_copy")
def split_copy_bytes(op: OpRecord) -> int:
    """A split into copies: the input read and as much written (a JIT graph holds no shapes of a
    list it returns), except the scalars ``unbind_copy`` makes of a 1-D tensor."""
    source = op.input(0)
    scalars = op.kind == "aten::unbind_copy" and isinstance(source, TensorMeta) and source.shape is not None and len(source.shape) == 1
    return tensor_bytes(source) * (1 if scalars else 2)


@BYTES_FORMULAS.register("aten::embedding_bag", "aten::_embedding_bag", "aten::_embedding_bag_forward_only")
def embedding_bag_bytes(op: OpRecord) -> int:
    """The rows the indices name (not the output's bags), the offsets and weights, the bags written."""
    weight, indices = op.arg("weight"), op.arg("indices")
    rows = math.ceil(indices.numel * weight.shape[-1] * dtype_bytes(weight.dtype))
    extra = sum(tensor_bytes(op.arg_or(name, None)) for name in ("offsets", "per_sample_weights"))
    return tensor_bytes(indices) + rows + extra + tensor_bytes(op.outputs[0])


@BYTES_FORMULAS.register("aten::dropout", "aten::dropout_", "aten::feature_dropout", "aten::feature_dropout_", "aten::alpha_dropout",
                         "aten::alpha_dropout_", "aten::feature_alpha_dropout", "aten::feature_alpha_dropout_")
def dropout_bytes(op: OpRecord) -> int:
    """An identity when not training (the dispatch backend sees no op); else the input read, the
    output and its mask written."""
    if not op.arg("train") or op.arg("p") == 0:
        return 0
    output = op.outputs[0]
    return tensor_traffic(op) + (output.numel if isinstance(output, TensorMeta) and output.shape is not None else 0)


def _copy(op: OpRecord) -> int:
    return tensor_bytes(op.input(0)) + tensor_bytes(op.outputs[0])


@BYTES_FORMULAS.register("aten::conj_physical")
def conjugate_bytes(op: OpRecord) -> int:
    """A copy of a complex tensor; a real one is returned as it is."""
    source = op.input(0)
    return _copy(op) if isinstance(source, TensorMeta) and source.dtype is not None and source.dtype.is_complex else 0


@BYTES_FORMULAS.register("aten::to", "aten::type_as", "aten::float", "aten::double", "aten::half", "aten::bfloat16", "aten::int",
                         "aten::long", "aten::bool")
def cast_bytes(op: OpRecord) -> int:
    """A copy, unless the cast is to the dtype the tensor has (the dispatch backend sees no op)."""
    source, output = op.input(0), op.outputs[0]
    if isinstance(source, TensorMeta) and isinstance(output, TensorMeta) and source.dtype == output.dtype:
        return 0
    return _copy(op)


_CONTIGUOUS_FORMAT = (torch.contiguous_format, 0)
"""The contiguous memory format as the dispatch backend and the JIT trace (an enum's int) record it."""


@BYTES_FORMULAS.register("aten::clone")
def clone_bytes(op: OpRecord) -> int:
    """A copy, unless it is one to the contiguous format: what ``contiguous`` and a ``reshape``
    that cannot be a view run (the convention's layout changes, which move nothing)."""
    return 0 if op.arg_or("memory_format", None) in _CONTIGUOUS_FORMAT else _copy(op)


class TrafficFormulas(Mapping[str, Handle]):
    """The handles of a bytes analysis: ``handles`` where set, else every op's tensors, read and
    written (:func:`tensor_traffic`), except the ops ``ignored`` and graph bookkeeping
    (``prim::``: a custom Function is counted by the ops it is made of)."""

    GENERIC = ShapeFormula(tensor_traffic)

    def __init__(self, handles: Mapping[str, Handle], ignored: frozenset[str] | set[str]) -> None:
        self._handles = handles
        self._ignored = ignored

    def __getitem__(self, kind: str) -> Handle:
        found = self._handles.get(kind)
        if found is not None:
            return found
        if kind in self._ignored or kind.startswith("prim::"):
            raise KeyError(kind)
        return self.GENERIC

    def __iter__(self) -> Iterator[str]:
        return iter(self._handles)

    def __len__(self) -> int:
        return len(self._handles)
