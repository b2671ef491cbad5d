"""Very large models counted on the meta device, without allocating their memory."""

from __future__ import annotations

import resource

import pytest

from jitflops import FlopCountAnalysis
from jitflops.examples import ZOO

pytest.importorskip("transformers")


def test_llama3_8b_on_meta_matches_the_hand_derived_count():
    hidden, layers, heads, kv_heads, ffn, vocab, tokens = 4096, 32, 32, 8, 14336, 128256, 2048
    model, args, kwargs = ZOO["llama-8b"].instantiate("meta")
    parameters = sum(p.numel() for p in model.parameters())
    head_dim = hidden // heads
    per_layer = 2 * hidden * hidden + 2 * hidden * head_dim * kv_heads + 3 * hidden * ffn + 2 * hidden
    assert parameters == 2 * vocab * hidden + layers * per_layer + hidden > 7e9
    analysis = FlopCountAnalysis(model, args, kwargs)
    linear_weights = layers * (per_layer - 2 * hidden) + vocab * hidden  # every matrix but the embedding
    attention = layers * heads * tokens * tokens * 2 * head_dim
    assert analysis.by_operator() == {"linear": tokens * linear_weights, "scaled_dot_product_attention": attention}
    assert analysis.unsupported_ops() == {}
    assert analysis.total("model.layers.0.self_attn") == tokens * (2 * hidden * hidden + 2 * hidden * head_dim * kv_heads) + attention // layers
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 * 1024 * 1024  # KiB: far below the 32 GB of its weights


def test_a_meta_trace_leaves_fake_tensor_convolutions_working():
    """A meta trace swaps in jitflops' meta kernel for ``aten::convolution`` and removes it after,
    yet a FakeTensorMode that meets its first convolution after it still reaches that kernel (torch
    2.11 and 2.13). On torch 2.11 it then failed in ``convolution_overrideable``: ``memory_footprint``
    of every convolutional model, after a count on meta values, in the same process (found by
    tools/gpu_check.py on an H100). Run alone (``-k``) on torch 2.11, this fails without the fix.
    The estimate after the trace is checked against torch's MemTracker of the same forward."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from jitflops import memory_footprint
    from jitflops.examples import all_examples

    model, args, kwargs = all_examples()["convnet"].instantiate("cpu")
    assert FlopCountAnalysis(*all_examples()["convnet"].instantiate("meta")).total() == FlopCountAnalysis(model, args, kwargs).total()
    estimate = memory_footprint(model, args, kwargs).peak
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker, torch.no_grad():
        model(*args, **kwargs)
    measured = next(peak["Total"] for where, peak in tracker.get_tracker_snapshot("peak").items() if where.type == "cpu")
    assert estimate == measured + sum(t.untyped_storage().nbytes() for t in args)
