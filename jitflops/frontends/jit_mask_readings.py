"""A JIT trace's attention masks, read by running the model once: the mask-aware convention under
the JIT front end.

A JIT graph holds shapes, not values, so an explicit mask (SDPA's ``attn_mask``, or one added to
eager attention's scores) cannot be read from it. Where the mask-aware count needs one, the call is
recorded once by the dispatch backend, and what it read (each attention op's mask, each softmax's
scores: their kept entries) is handed to the JIT's ops of the same kind in the same module, in the
order they ran. Eager attention's products are then marked as the dispatch backend marks them
(:mod:`jitflops.frontends.masked_scores`). Where the eager run took SDPA's math path (products and a softmax:
query and value head dims that differ, as in MLA), the softmaxes' scores are the SDPA ops' readings.
Where the two front ends otherwise disagree on how many such ops a module ran, that module's ops
keep their dense count.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from dataclasses import replace
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from ..handles.attention import ATTENTION_KERNELS, ATTENTION_PRODUCTS, SOFTMAX_KINDS, causal_pairs
from .masked_scores import MaskedScorePairing
from ..core.op_source import OpSource
from ..core.records import OpRecord, TensorMeta

MASKED_ATTENTION_KINDS = frozenset({"aten::scaled_dot_product_attention", *ATTENTION_KERNELS})

_MASKING_KINDS = frozenset({"aten::add", "aten::add_", "aten::sub", "aten::masked_fill", "aten::masked_fill_", "aten::where"})
"""How a mask reaches eager attention's scores."""
_PASSED_THROUGH = frozenset({
    "aten::mul", "aten::div", "aten::to", "aten::type_as", "aten::contiguous", "aten::float", "aten::view", "aten::reshape",
    "aten::_unsafe_view", "aten::max", "aten::maximum", "aten::clamp", "aten::clamp_min",
})
"""What may stand between the masking op and the softmax: a scale, a cast, a view (BART's family
adds the mask to (batch, heads, L, S) scores and views them back as (batch x heads, L, S)), a floor
at the dtype's minimum (XGLM's ``torch.max(scores, finfo.min)``)."""


def _masked_input(record: OpRecord) -> bool:
    """Whether an op's first input may carry a mask: an attention op's ``attn_mask`` that is not
    None, or a softmax's scores that an add, a ``masked_fill`` or a ``where`` made."""
    if record.kind in MASKED_ATTENTION_KINDS:
        return isinstance(record.arg_or("attn_mask", None), TensorMeta)
    producer = record.node.inputsAt(0).node()
    for _ in range(4):
        if producer.kind() in _MASKING_KINDS:
            return True
        if producer.kind() not in _PASSED_THROUGH or not producer.inputsSize():
            return False
        producer = producer.inputsAt(0).node()
    return False


def _category(kind: str) -> str:
    """Which readings an op takes: an attention op's mask, or a softmax's scores."""
    return "attention" if kind in MASKED_ATTENTION_KINDS else "softmax"


def _attention_mask_read(record: OpRecord) -> Optional[TensorMeta]:
    """The mask an attention op ran with: its ``attn_mask``, or, where it took none and ran causally,
    the causal mask as an (L, S) mask of the pairs ``is_causal`` keeps. Transformers passes
    ``is_causal=True`` and no mask where a run needs no padding mask, but materialises the causal
    mask under the JIT tracer: the trace's op then holds a mask of those same kept pairs."""
    mask = record.arg_or("attn_mask", None)
    if mask is None and record.arg_or("is_causal", False):
        target, source = record.shape("query")[-2], record.shape("key")[-2]
        return TensorMeta((target, source), torch.bool, kept=causal_pairs(target, source))
    return mask


def _read_by_scope(recording: OpSource) -> dict[tuple[str, str], list[Optional[TensorMeta]]]:
    """What the dispatch recording read, per (scope, "attention" or "softmax"), in order."""
    read: dict[tuple[str, str], list[Optional[TensorMeta]]] = defaultdict(list)
    for kind, item in recording.operations():
        if kind in MASKED_ATTENTION_KINDS or kind in SOFTMAX_KINDS:
            record = recording.record(item, kind, "")
            value = _attention_mask_read(record) if kind in MASKED_ATTENTION_KINDS else record.input(0)
            read[(recording.scope_of(item), _category(kind))].append(value)
    return read


def _as_read(current: TensorMeta, read: TensorMeta) -> Optional[TensorMeta]:
    """The trace's mask ``current`` with its kept entries, from the mask ``read`` as the op ran: the
    same mask, or one that broadcasts to it (a causal (L, S) mask read, materialised per batch in
    the trace); or the reading itself where ``current`` broadcasts to it (the scores of SDPA's
    decomposed math, whose softmax saw the mask over every head). None where the two do not fit."""
    if read.kept is None or current.shape is None or read.shape is None:
        return None
    try:
        broadcast = torch.broadcast_shapes(read.shape, current.shape)
    except RuntimeError:
        return None
    if broadcast == current.shape:
        return replace(current, kept=read.kept * (current.numel // read.numel))
    return read if broadcast == read.shape else None


class MaskReadingTrace:
    """A JIT trace (an op source) whose attention ops, softmaxes and eager attention's products
    carry what one eager run read of their masks. ``read`` records the call with the dispatch
    backend; it runs at the first op asked for, and only where some op may take a mask."""

    def __init__(self, trace: Any, read: Callable[[], OpSource]) -> None:
        self.trace = trace
        self._read = read
        self._records: Optional[dict[Any, OpRecord]] = None

    def operations(self) -> Iterator[tuple[str, Any]]:
        return self.trace.operations()

    def scope_of(self, item: Any) -> str:
        return self.trace.scope_of(item)

    def scopes(self) -> Iterator[str]:
        return self.trace.scopes()

    def parts(self, item: Any) -> Sequence[tuple[str, Any]]:
        return self.trace.parts(item)

    def replay_warnings(self, mode: str) -> None:
        self.trace.replay_warnings(mode)

    def record(self, item: Any, kind: str, module: str) -> OpRecord:
        if self._records is None:
            self._records = self._marked_records()
        return self._records.get(item[0]) or self.trace.record(item, kind, module)

    def _marked_records(self) -> dict[Any, OpRecord]:
        """The records of the ops the masks concern, marked with what the eager run read."""
        ops = [(kind, item) for kind, item in self.trace.operations() if kind in MASKED_ATTENTION_KINDS or kind in SOFTMAX_KINDS or kind in ATTENTION_PRODUCTS]
        records = {item[0]: self.trace.record(item, kind, self.trace.scope_of(item).rpartition("/")[2]) for kind, item in ops}
        if not any(_masked_input(records[item[0]]) for kind, item in ops if kind not in ATTENTION_PRODUCTS):
            return {}
        try:
            read = _read_by_scope(self._read())
        except Exception as error:  # the model does not run eagerly on these inputs: masks counted dense
            warnings.warn(f"jitflops: attention masks not read (the eager run failed: {error}); explicit masks count dense", stacklevel=2)
            return {}
        expected: dict[tuple[str, str], int] = defaultdict(int)
        for kind, item in ops:
            if kind not in ATTENTION_PRODUCTS:
                expected[(self.trace.scope_of(item), _category(kind))] += 1
        taken: dict[tuple[str, str], int] = defaultdict(int)
        marked: list[tuple[str, OpRecord]] = []
        pairing = MaskedScorePairing(marked)
        for kind, item in ops:
            path = self.trace.scope_of(item)
            record = records[item[0]]
            if kind not in ATTENTION_PRODUCTS:
                key = (path, _category(kind))
                index, taken[key] = taken[key], taken[key] + 1
                readings = read[key]
                if not readings and key[1] == "attention" and not expected[(path, "softmax")]:
                    readings = read[(path, "softmax")]  # the eager run took SDPA's math path: its softmaxes read the masks
                value = readings[index] if len(readings) == expected[key] else None
                argument = record.arg_names.index("attn_mask") if kind in MASKED_ATTENTION_KINDS else 0
                current = record.input(argument)
                marked_mask = _as_read(current, value) if isinstance(value, TensorMeta) and isinstance(current, TensorMeta) else None
                if marked_mask is not None:
                    record.set_input(argument, marked_mask)
            marked.append((path, record))
            pairing.after(path, record)
        return records
