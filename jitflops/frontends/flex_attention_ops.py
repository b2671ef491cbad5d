"""``flex_attention`` as one op of a dispatch recording, with the blocks its mask keeps.

Eager ``flex_attention`` is a higher-order operator that torch runs by compiling a wrapper around
it, and a dispatch mode sees neither the operator nor its parts. While a recording runs, the
wrapper is called uncompiled (torch's own debug switch, put back after), and a rule for the
recorder's mode class records the operator (``higher_order::flex_attention``) with its query, key
and value, and its block mask as the number of (query, key) pairs inside the blocks it keeps (the
partial and the full ones): what a block-sparse kernel computes. The operator then runs as it
would, with the recorder out of the way (its parts are the operator's, not the model's).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..core.records import TensorMeta

FLEX_ATTENTION_KIND = "higher_order::flex_attention"
FLEX_ATTENTION_ARGUMENTS = ("query", "key", "value", "block_mask")


def _flex_modules() -> Optional[tuple[Any, Any]]:
    try:
        import torch.nn.attention.flex_attention as front
        from torch._higher_order_ops.flex_attention import flex_attention as operator
    except ImportError:  # an older torch
        return None
    return front, operator


def _pairs_in_blocks(query_length: int, key_length: int, blocks: torch.Tensor, indices: torch.Tensor, query_block: int, key_block: int) -> int:
    """The (query, key) pairs inside the blocks listed: ``blocks[..., i]`` key blocks for query
    block ``i``, at ``indices[..., i, :]``; blocks at the ends hold what is left of the lengths."""
    rows = (query_length - torch.arange(blocks.shape[-1]) * query_block).clamp(0, query_block)
    listed = torch.arange(indices.shape[-1]) < blocks[..., None].long()
    columns = (key_length - indices.long() * key_block).clamp(0, key_block) * listed
    return int((columns.sum(-1) * rows).sum())


def block_mask_pairs(block_mask: tuple, query: torch.Tensor) -> Optional[int]:
    """The (query, key) pairs the blocks of a block mask (``BlockMask.as_tuple()``) keep, over the
    query's batch and heads (a mask made for one batch or head is broadcast); None where the tuple
    is not laid out as this torch's is."""
    try:
        query_length, key_length, blocks, indices, full_blocks, full_indices = block_mask[:6]
        query_block, key_block = block_mask[-3], block_mask[-2]
    except (TypeError, ValueError):
        return None
    if not (isinstance(blocks, torch.Tensor) and isinstance(query_block, int) and isinstance(key_block, int)):
        return None
    pairs = _pairs_in_blocks(query_length, key_length, blocks, indices, query_block, key_block)
    if isinstance(full_blocks, torch.Tensor):
        pairs += _pairs_in_blocks(query_length, key_length, full_blocks, full_indices, query_block, key_block)
    batch_heads = query.shape[0] * query.shape[1]
    return pairs * batch_heads // (blocks.shape[0] * blocks.shape[1])


def register_flex_attention(mode_class: type, record: Callable[[list[Any], Any], None], decode: Callable[[Any], Any]) -> None:
    """Record ``flex_attention`` under ``mode_class``: ``record(inputs, output)`` with the decoded
    query, key, value and the block mask's kept pairs (a :class:`TensorMeta` of the dense
    ``(batch, heads, L, S)`` scores whose ``kept`` is that count)."""
    modules = _flex_modules()
    if modules is None:
        return
    operator = modules[1]

    @operator.py_impl(mode_class)
    def _recorded(mode: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod: Any, block_mask: tuple, *rest: Any, **kwargs: Any) -> Any:
        output = operator(query, key, value, score_mod, block_mask, *rest, **kwargs)
        scores = (*query.shape[:-1], key.shape[-2])
        kept = None if isinstance(query, FakeTensor) else block_mask_pairs(block_mask, query)  # fake: sizes in symbols
        mask = TensorMeta(tuple(scores), torch.bool, kept)
        record(mode, [decode(query), decode(key), decode(value), mask], output)
        return output


@contextmanager
def flex_attention_uncompiled() -> Iterator[None]:
    """Eager ``flex_attention`` calls its operator directly for the body (torch compiles a wrapper
    around it otherwise, which traces the recorder's rule instead of running it)."""
    modules = _flex_modules()
    if modules is None:
        yield
        return
    front = modules[0]
    before = front._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    front._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    try:
        yield
    finally:
        front._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = before
