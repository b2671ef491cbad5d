"""``scaled_dot_product_attention``: the two matrix products, for every head layout.

Counted: ``query @ key^T`` (L x S x E per query head) and ``weights @ value`` (L x S x Ev per query
head). The batch dims are the query's, so grouped-query and multi-query attention, where keys and
values have fewer heads than queries, count the work each query head does.

Not counted, as for other elementwise work: the scale, the mask, the softmax and dropout.

By default a causal mask does **not** halve the count. What a causal mask saves depends on the
kernel: the math and memory-efficient kernels compute the full L x S product and mask it
afterwards; flash kernels skip whole blocks above the diagonal, which saves close to half only when
L is much larger than the block size. The dense count is what every kernel is charged for the same
shapes, matches ``torch.utils.flop_counter``, and is what papers report for attention layers.

The mask-aware convention (:data:`MASKED_ATTENTION_FORMULAS`, ``FlopCountAnalysis(...,
attention="masked")``) counts the useful work instead: the (query, key) pairs the mask keeps.
``is_causal`` keeps ``min(i + 1, S)`` keys for query ``i`` (torch's top-left alignment: L(L+1)/2
when the lengths are equal); an explicit mask (sliding windows, chunks, padding, block-sparse
patterns) keeps the entries it lets through, read as the op ran (by the dispatch backend; under the
JIT, whose trace holds no values, by one eager run: :mod:`jitflops.frontends.jit_mask_readings`). Attention written out in products and a
softmax counts its two products by the scores the mask keeps (:mod:`jitflops.frontends.masked_scores`).

The dispatch front end sees the kernels (flash, memory-efficient, cuDNN, the CPU flash kernel),
with the same ``query``/``key``/``value`` layout, and their backward: the gradients of query, key
and value and of the attention weights are four products of the same sizes, twice the forward.
These kernels keep no attention weights, so their backward first recomputes the scores
``query @ key^T``: a fifth product, counted under ``recompute.<op>`` as activation checkpointing's
recomputed forward is, so the count of what ran (and HFU) has five products, as
``FlopCounterMode`` counts them, and the model's FLOPs (MFU) twice the forward.

The raw CUDA kernels under them, ``_flash_attention_*`` and ``_efficient_attention_*`` (what
varlen and nested-tensor attention call), take (batch, sequence, heads, dim), not SDPA's (batch,
heads, sequence, dim), or packed sequences (total tokens, heads, dim) with cumulative offsets.
Packed sequences count as ``FlopCounterMode`` counts them on fake tensors: every sequence at the
largest length (``max_q`` x ``max_k`` pairs), an upper bound, since a record holds no offsets' values.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ..core.errors import OpShapeError
from ..core.records import RECOMPUTE, OpRecord, TensorMeta
from .einsum import einsum_flops
from .linear_algebra import baddbmm_flops, matmul_flops
from .registry import FLOP_FORMULAS, FormulaTable, short_op_name
from .shapes import prod


ATTENTION_KERNELS = (
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
)


SEQUENCE_FIRST_KERNELS = ("aten::_flash_attention_forward", "aten::_efficient_attention_forward")
"""The CUDA kernels under SDPA's flash and memory-efficient backends, in (batch, sequence, heads,
dim) layout, or packed (total tokens, heads, dim)."""

_PACKED_LENGTHS = {"aten::_flash_attention": ("max_q", "max_k"), "aten::_efficient_attention": ("max_seqlen_q", "max_seqlen_k")}
_OFFSETS = {"aten::_flash_attention": "cum_seq_q", "aten::_efficient_attention": "cu_seqlens_q"}


def _family(kind: str) -> str:
    """``aten::_flash_attention_backward`` -> ``aten::_flash_attention``."""
    return kind.rsplit("_", 1)[0]


def attention_shape(op: OpRecord) -> tuple[int, int, int]:
    """An attention op's (query, key) pairs over its batch and query heads, and its query and
    value head dims, in the op's own layout."""
    query, key, value = op.shape("query"), op.shape("key"), op.shape("value")
    if _family(op.kind) not in _PACKED_LENGTHS:  # SDPA's layout: (..., heads, sequence, dim)
        if len(query) < 2 or key[-1] != query[-1] or key[-2] != value[-2]:
            raise OpShapeError(op.kind, op.scope, f"query {query}, key {key} and value {value} do not fit together")
        return prod(query[:-2]) * query[-2] * key[-2], query[-1], value[-1]
    if len(query) == 3:  # packed: every sequence at the largest lengths
        offsets = op.arg(_OFFSETS[_family(op.kind)])
        if offsets is None:
            raise OpShapeError(op.kind, op.scope, f"packed query {query} without cumulative sequence offsets")
        longest_query, longest_key = (op.arg(name) for name in _PACKED_LENGTHS[_family(op.kind)])
        return (offsets.numel - 1) * query[1] * longest_query * longest_key, query[-1], value[-1]
    if len(query) != 4 or key[-1] != query[-1] or key[1] != value[1] or key[0] != query[0]:
        raise OpShapeError(op.kind, op.scope, f"query {query}, key {key} and value {value} do not fit the (batch, sequence, heads, dim) layout")
    batch, target_length, heads, _ = query
    return batch * heads * target_length * key[1], query[-1], value[-1]


@FLOP_FORMULAS.register("aten::scaled_dot_product_attention", "higher_order::flex_attention", *ATTENTION_KERNELS, *SEQUENCE_FIRST_KERNELS)
def attention_flops(op: OpRecord) -> int:
    pairs, head_dim, value_dim = attention_shape(op)
    return pairs * (head_dim + value_dim)


@FLOP_FORMULAS.register(*(f"{kernel}_backward" for kernel in ATTENTION_KERNELS), *(f"{family}_backward" for family in _PACKED_LENGTHS))
def attention_backward_flops(op: OpRecord) -> Counter:
    """The gradients' four products (twice the forward) and the scores the kernel recomputes first,
    under ``recompute.``: 2·B·H·L·S·(3·E + 2·Ev) FLOPs in all."""
    pairs, head_dim, value_dim = attention_shape(op)
    key = short_op_name(op.kind)
    return Counter({key: 2 * pairs * (head_dim + value_dim), f"{RECOMPUTE}.{key}": pairs * head_dim})


SOFTMAX_KINDS = frozenset({"aten::_softmax", "aten::softmax", "aten::_safe_softmax"})

ATTENTION_PRODUCTS = {"aten::bmm": "self", "aten::mm": "self", "aten::matmul": "self", "aten::baddbmm": "batch1", "aten::einsum": "tensors"}
"""The products eager attention is built from, each with its left operand (the weights, in ``weights @ value``;
an einsum's first operand), which the JIT keeps whole where the dispatch backend sees ``bmm``."""


def _left_operand_index(op: OpRecord) -> int:
    return op.arg_names.index(ATTENTION_PRODUCTS[op.kind]) if op.arg_names else 0


def left_operand(op: OpRecord) -> object:
    """An attention product's left operand (an einsum's first tensor)."""
    value = op.input(_left_operand_index(op))
    return value[0] if isinstance(value, list) and value else value


def mark_left_operand(op: OpRecord, kept: int) -> None:
    """Mark an attention product's left operand (the weights) with the entries its mask kept."""
    index = _left_operand_index(op)
    value = op.input(index)
    if isinstance(value, list):
        op.set_input(index, [replace(value[0], kept=kept), *value[1:]])
    else:
        op.set_input(index, replace(value, kept=kept))

MASKED_ATTENTION_FORMULAS = FormulaTable("mask-aware attention formulas")
"""The forward attention ops counted by the pairs their mask keeps (the ``attention="masked"`` convention)."""


def causal_pairs(target_length: int, source_length: int) -> int:
    """(query, key) pairs a causal mask keeps: query ``i`` sees keys ``0..i`` (torch's ``is_causal``)."""
    if source_length >= target_length:
        return target_length * (target_length + 1) // 2
    return source_length * (source_length + 1) // 2 + (target_length - source_length) * source_length


def bottom_right_causal_pairs(target_length: int, source_length: int) -> int:
    """(query, key) pairs a causal mask aligned to the bottom right keeps (the memory-efficient
    kernel's ``custom_mask_type`` 2): the last query sees every key."""
    if source_length >= target_length:
        return target_length * (source_length - target_length) + target_length * (target_length + 1) // 2
    return source_length * (source_length + 1) // 2


_CAUSAL_MASK_TYPES = {1: causal_pairs, 2: bottom_right_causal_pairs}
"""The memory-efficient kernel's ``custom_mask_type``: 0 none, 1 causal from the top left, 2 from the bottom right."""


def _lengths(op: OpRecord) -> tuple[int, int]:
    """An unpacked attention op's query and key lengths, in its layout."""
    query, key = op.shape("query"), op.shape("key")
    return (query[1], key[1]) if _family(op.kind) in _PACKED_LENGTHS else (query[-2], key[-2])


@MASKED_ATTENTION_FORMULAS.register("aten::scaled_dot_product_attention", "higher_order::flex_attention", *ATTENTION_KERNELS, *SEQUENCE_FIRST_KERNELS)
def masked_attention_flops(op: OpRecord) -> int:
    pairs, head_dim, value_dim = attention_shape(op)
    dense = pairs * (head_dim + value_dim)
    mask = op.arg_or("attn_mask", None) or op.arg_or("block_mask", None)
    causal = causal_pairs if op.arg_or("is_causal", False) else _CAUSAL_MASK_TYPES.get(op.arg_or("custom_mask_type", 0))
    if mask is not None and mask.kept is not None:
        kept = mask.kept * (pairs // mask.numel)  # the mask broadcast over the heads (and batch) it omits
    elif causal is not None and len(op.shape("query")) != 3:  # packed sequences: lengths unknown, counted dense
        target_length, source_length = _lengths(op)
        kept = pairs // (target_length * source_length) * causal(target_length, source_length)
    else:
        return dense
    return dense * kept // pairs


@MASKED_ATTENTION_FORMULAS.register(*ATTENTION_PRODUCTS)
def masked_product_flops(op: OpRecord) -> int:
    """Eager attention (``softmax(q @ k^T + mask) @ v`` in products): the scores product counts the
    scores its mask keeps, the weights product the weights it keeps, where the dispatch backend
    marked them (:mod:`jitflops.frontends.masked_scores`); any other product counts dense."""
    dense = {"aten::baddbmm": baddbmm_flops, "aten::einsum": einsum_flops}.get(op.kind, matmul_flops)(op)
    for meta in (op.outputs[0], left_operand(op)):
        if isinstance(meta, TensorMeta) and meta.kept is not None:
            return dense * meta.kept // meta.numel
    return dense
