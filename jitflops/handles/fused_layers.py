"""torch's fused inference kernels for its own transformer layers.

In eval mode without gradients, ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` run
one fused kernel each (``_native_multi_head_attention``, ``_transformer_encoder_layer_fwd``)
instead of their linear layers, attention and norms. Each is counted as the ops it fuses, under
those ops' names, so eval and train mode give the same numbers, per operator too:

* ``linear``: the query, key and value projections (``tokens x E x E`` each, the key and value
  ones over the source tokens), the output projection, and the two feed-forward layers;
* ``scaled_dot_product_attention``: ``Q K^T`` and the weighted sum of ``V`` over all heads,
  ``2 x batch x L x S x E``;
* ``layer_norm``: two norms, 5 per element.
"""

from __future__ import annotations

from collections import Counter

from ..core.records import OpRecord
from .registry import FLOP_FORMULAS
from .shapes import prod


def _attention_block(query: tuple[int, ...], key: tuple[int, ...], embed_dim: int) -> Counter:
    queries, keys = prod(query[:-1]), prod(key[:-1])
    source_length = key[-2] if len(key) >= 2 else 1
    return Counter({
        "linear": (2 * queries + 2 * keys) * embed_dim * embed_dim,  # q and output projections; k and v
        "scaled_dot_product_attention": 2 * queries * source_length * embed_dim,
    })


@FLOP_FORMULAS.register("aten::_native_multi_head_attention")
def multi_head_attention_flops(op: OpRecord) -> Counter:
    return _attention_block(op.shape("query"), op.shape("key"), op.arg("embed_dim"))


@FLOP_FORMULAS.register("aten::_transformer_encoder_layer_fwd")
def transformer_encoder_layer_flops(op: OpRecord) -> Counter:
    source = op.shape("src")
    embed_dim = op.arg("embed_dim")
    counts = _attention_block(source, source, embed_dim)
    tokens = prod(source[:-1])
    counts["linear"] += tokens * (prod(op.shape("ffn_weight_1")) + prod(op.shape("ffn_weight_2")))
    counts["layer_norm"] = 2 * 5 * tokens * embed_dim
    return counts
