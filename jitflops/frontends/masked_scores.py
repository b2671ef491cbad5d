"""Eager attention's mask, paired with its two products as the dispatch backend records them.

Attention written out in products (Hugging Face's ``eager`` implementation, most research code)
runs ``scores = q @ k^T``, adds the mask (``-inf`` or the dtype's minimum where attention is
masked), takes ``softmax`` and multiplies ``weights @ v``. The mask itself never reaches a product:
the softmax's input is where it shows, read as the op ran (how many scores it keeps). The
mask-aware convention (:data:`~jitflops.handles.attention.MASKED_ATTENTION_FORMULAS`) counts both
products by that share, so this marks them in the records:

* the scores product: the nearest product before the softmax, in the same module, whose output has
  as many entries as the softmax's input (its output is marked with the kept count);
* the weights product: the first product after it, in the same module, whose left operand has as
  many entries (its left operand is marked).

Both are marked only once the weights product comes: a softmax between two products is attention,
one whose output goes elsewhere is not (a mixture-of-experts router masks its logits to the top
experts and takes their softmax, which no product follows). Nothing is marked where the softmax
masks nothing, so the dense count and every other product stay
as they were. A JIT trace's ops are marked the same way, with what one eager run read
(:mod:`jitflops.frontends.jit_mask_readings`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ..handles.attention import ATTENTION_PRODUCTS, SOFTMAX_KINDS, left_operand, mark_left_operand
from ..core.records import BACKWARD, OpRecord, TensorMeta

LOOK_BACK = 24
"""How many ops before a softmax the scores product may be: a scale, a mask add, a cast, and the
views and arithmetic that build a mask in place (GPT-1's ``w * b + -1e4 * (1 - b)`` on a slice of
its causal buffer, a dozen ops in a dispatch recording)."""


def _entries(value: object) -> int | None:
    return value.numel if isinstance(value, TensorMeta) and value.shape is not None else None


class MaskedScorePairing:
    """Marks the products of eager attention in a dispatch recording's records as they come
    (:meth:`after` each record)."""

    def __init__(self, records: list[tuple[str, OpRecord]]) -> None:
        self.records = records
        self._waiting: dict[tuple[str, str], tuple[TensorMeta, Optional[OpRecord]]] = {}
        """A masked softmax's input and its scores product, by (scope, phase), until its weights product comes."""

    def after(self, path: str, record: OpRecord) -> None:
        if record.phase == BACKWARD:
            return
        if record.kind in SOFTMAX_KINDS:
            self._softmax(path, record)
        elif record.kind in ATTENTION_PRODUCTS and self._waiting:
            self._weights_product(path, record)

    def _softmax(self, path: str, record: OpRecord) -> None:
        scores = record.input(0)
        if not isinstance(scores, TensorMeta) or scores.kept is None or scores.kept == _entries(scores):
            return
        scores_product = next(
            (earlier for earlier_path, earlier in reversed(self.records[-LOOK_BACK - 1:-1])
             if earlier_path == path and earlier.kind in ATTENTION_PRODUCTS and _entries(earlier.outputs[0]) == scores.numel),
            None,
        )  # None: the scores came from elsewhere (an einsum); the weights product is marked alone
        self._waiting[(path, record.phase)] = (scores, scores_product)

    def _weights_product(self, path: str, record: OpRecord) -> None:
        waiting = self._waiting.get((path, record.phase))
        if waiting is None:
            return
        scores, scores_product = waiting
        if _entries(left_operand(record)) == scores.numel:
            if scores_product is not None:
                scores_product.outputs[0] = replace(scores_product.outputs[0], kept=scores.kept)
            mark_left_operand(record, scores.kept)
            del self._waiting[(path, record.phase)]
