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
JIT, whose trace holds no values, by one eager run: :mod:`jitflops.jit_mask_readings`). Attention written out in products and a
softmax counts its two products by the scores the mask keeps (:mod:`jitflops.masked_scores`).

The dispatch front end sees the kernels (flash, memory-efficient, cuDNN, the CPU flash kernel),
with the same ``query``/``key``/``value`` layout, and their backward: the gradients of query, key
and value and of the attention weights are four products of the same sizes, twice the forward.
"""

from __future__ import annotations

from ..errors import OpShapeError
from ..records import OpRecord, TensorMeta
from .linear_algebra import baddbmm_flops, matmul_flops
from .registry import FLOP_FORMULAS, FormulaTable
from .shapes import prod


def attention_macs(query: tuple[int, ...], key: tuple[int, ...], value: tuple[int, ...]) -> int:
    *batch, target_length, head_dim = query
    source_length, value_dim = key[-2], value[-1]
    return prod(batch) * target_length * source_length * (head_dim + value_dim)


ATTENTION_KERNELS = (
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
)


@FLOP_FORMULAS.register("aten::scaled_dot_product_attention", "higher_order::flex_attention", *ATTENTION_KERNELS)
def attention_flops(op: OpRecord) -> int:
    query, key, value = op.shape("query"), op.shape("key"), op.shape("value")
    if len(query) < 2 or key[-1] != query[-1] or key[-2] != value[-2]:
        raise OpShapeError(op.kind, op.scope, f"query {query}, key {key} and value {value} do not fit together")
    return attention_macs(query, key, value)


@FLOP_FORMULAS.register(*(f"{kernel}_backward" for kernel in ATTENTION_KERNELS))
def attention_backward_flops(op: OpRecord) -> int:
    return 2 * attention_flops(op)


SOFTMAX_KINDS = frozenset({"aten::_softmax", "aten::softmax", "aten::_safe_softmax"})

ATTENTION_PRODUCTS = {"aten::bmm": "self", "aten::mm": "self", "aten::matmul": "self", "aten::baddbmm": "batch1"}
"""The products eager attention is built from, each with its left operand (the weights, in ``weights @ value``)."""

MASKED_ATTENTION_FORMULAS = FormulaTable("mask-aware attention formulas")
"""The forward attention ops counted by the pairs their mask keeps (the ``attention="masked"`` convention)."""


def causal_pairs(target_length: int, source_length: int) -> int:
    """(query, key) pairs a causal mask keeps: query ``i`` sees keys ``0..i`` (torch's ``is_causal``)."""
    if source_length >= target_length:
        return target_length * (target_length + 1) // 2
    return source_length * (source_length + 1) // 2 + (target_length - source_length) * source_length


@MASKED_ATTENTION_FORMULAS.register("aten::scaled_dot_product_attention", "higher_order::flex_attention", *ATTENTION_KERNELS)
def masked_attention_flops(op: OpRecord) -> int:
    dense = attention_flops(op)
    query, key = op.shape("query"), op.shape("key")
    pairs = prod(query[:-2]) * query[-2] * key[-2]
    mask = op.arg_or("attn_mask", None) or op.arg_or("block_mask", None)
    if mask is not None and mask.kept is not None:
        kept = mask.kept * (pairs // mask.numel)  # the mask broadcast over the heads (and batch) it omits
    elif op.arg_or("is_causal", False):
        kept = prod(query[:-2]) * causal_pairs(query[-2], key[-2])
    else:
        return dense
    return dense * kept // pairs


@MASKED_ATTENTION_FORMULAS.register(*ATTENTION_PRODUCTS)
def masked_product_flops(op: OpRecord) -> int:
    """Eager attention (``softmax(q @ k^T + mask) @ v`` in products): the scores product counts the
    scores its mask keeps, the weights product the weights it keeps, where the dispatch backend
    marked them (:mod:`jitflops.masked_scores`); any other product counts dense."""
    dense = baddbmm_flops(op) if op.kind == "aten::baddbmm" else matmul_flops(op)
    for meta in (op.outputs[0], op.arg(ATTENTION_PRODUCTS[op.kind])):
        if isinstance(meta, TensorMeta) and meta.kept is not None:
            return dense * meta.kept // meta.numel
    return dense
