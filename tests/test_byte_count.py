"""Bytes each op reads and writes (``ByteCountAnalysis``), against hand counts, the other front end,
and an independent count of torch's op database: every tensor an op takes and returns as it runs
under a dispatch mode, where the convention differs by a named reason."""

from __future__ import annotations

import logging
import warnings
from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from jitflops import ByteCountAnalysis
from jitflops.examples import all_examples
from jitflops.handles import short_op_name
from jitflops.handles.traffic import BYTES_FORMULAS, FIRST_OUTPUT_ONLY, METADATA_OPS

BACKENDS = ("jit", "dispatch")


class Call(nn.Module):
    def __init__(self, function) -> None:
        super().__init__()
        self.function = function

    def forward(self, *args):
        return self.function(*args)


def _bytes(model, *args, backend="jit", **settings) -> ByteCountAnalysis:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = ByteCountAnalysis(model, args, backend=backend, **settings)
        analysis.total()
    return analysis


def _size(*shape, width=4):
    return torch.Size(shape).numel() * width


@pytest.mark.parametrize("backend", BACKENDS)
def test_hand_counts(backend):
    """Each case: what the op reads (inputs once, at their own size and width) and writes."""
    linear = nn.Linear(64, 32).to(torch.bfloat16)
    x16 = torch.randn(8, 64, dtype=torch.bfloat16)
    assert _bytes(linear, x16, backend=backend).total() == _size(8, 64, width=2) + _size(32, 64, width=2) + _size(32, width=2) + _size(8, 32, width=2)

    conv = nn.Conv2d(3, 8, 3, padding=1)
    image = torch.randn(2, 3, 16, 16)
    assert _bytes(conv, image, backend=backend).total() == _size(2, 3, 16, 16) + _size(8, 3, 3, 3) + _size(8) + _size(2, 8, 16, 16)

    a, b = torch.randn(4, 8, 16), torch.randn(4, 16, 32)
    assert _bytes(Call(torch.bmm), a, b, backend=backend).total() == _size(4, 8, 16) + _size(4, 16, 32) + _size(4, 8, 32)

    q, kv = torch.randn(2, 8, 16, 32), torch.randn(2, 2, 16, 32)  # grouped-query: keys and values read once, at 2 heads
    sdpa = Call(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    assert _bytes(sdpa, q, kv, kv, backend=backend).total() == 2 * _size(2, 8, 16, 32) + 2 * _size(2, 2, 16, 32)

    norm, tokens = nn.LayerNorm(64), torch.randn(4, 10, 64)  # a fused op: its mean and deviation are not the result
    assert _bytes(norm, tokens, backend=backend).total() == 2 * _size(4, 10, 64) + 2 * _size(64)

    table, ids = nn.Embedding(1000, 64), torch.randint(0, 1000, (2, 7))  # the 14 rows it uses, not the table
    assert _bytes(table, ids, backend=backend).total() == _size(2, 7, width=8) + 2 * _size(14, 64)

    assert _bytes(Call(torch.add), torch.randn(8, 64), torch.randn(64), backend=backend).total() == 2 * _size(8, 64) + _size(64)

    assert _bytes(Call(torch.relu_), torch.randn(8, 64), backend=backend).total() == 2 * _size(8, 64)  # in place: read and written

    views = Call(lambda x: x.view(4, 2, 8).permute(2, 0, 1).unsqueeze(0).flatten(0, 1).reshape(8, 8)[1:])
    assert _bytes(views, torch.randn(8, 8), backend=backend).total() == 0

    assert _bytes(Call(lambda a, b: torch.cat([a, b], 1)), torch.randn(2, 3), torch.randn(2, 5), backend=backend).total() == 2 * _size(2, 8)


def test_identities_at_run_time_move_nothing():
    """Dropout when not training, a cast to the dtype a tensor has, a layout copy: 0 under both
    front ends; in training, dropout reads its input and writes its output and mask."""
    x = torch.randn(8, 64)
    for backend in BACKENDS:
        assert _bytes(Call(lambda x: F.dropout(x, 0.5, training=False).float().contiguous()), x, backend=backend).total() == 0
        assert _bytes(Call(lambda x: x.t().contiguous()), x, backend=backend).total() == 0
        assert _bytes(Call(lambda x: x.to(torch.float16)), x, backend=backend).total() == _size(8, 64) + _size(8, 64, width=2)
    dropout = Call(lambda x: F.dropout(x, 0.5, training=True))
    assert _bytes(dropout, x).total() == 2 * _size(8, 64) + _size(8, 64, width=1)  # the fused kernel: its boolean mask
    # the dispatch backend sees what the CPU runs instead: a noise tensor drawn (bernoulli_), scaled (div_), multiplied
    assert _bytes(dropout, x, backend="dispatch").by_operator() == {"bernoulli_": 2 * _size(8, 64), "div_": 2 * _size(8, 64), "mul": 3 * _size(8, 64)}


def test_sub_byte_and_float8_widths():
    from jitflops.handles.traffic import dtype_bytes

    assert [dtype_bytes(dtype) for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.uint4, torch.int8)] == [4, 2, 1, 0.5, 1]


ZOO = ["convnet", "transformer", "bert-base", "gpt2", "llama-gqa", "t5-small", "vit-b16", "resnet-50", "mobilenet-v2", "convnext-t"]
KNOWN_ZOO_DIFFERENCES = {
    "lstm": "the JIT sees one fused aten::lstm, the dispatch backend the CPU's per-layer kernels with their workspaces",
    "swin-t": "the model's own torch.jit.is_tracing() branch makes a tensor of its window sizes (16 bytes) the eager run does not",
}


@pytest.mark.parametrize("name", ZOO)
def test_both_front_ends_give_equal_bytes_on_the_zoo(name):
    logging.disable(logging.WARNING)
    try:
        model, args, kwargs = all_examples()[name].instantiate("cpu")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            counts = {backend: ByteCountAnalysis(model, args, kwargs, backend=backend) for backend in BACKENDS}
            counts["jit"].total()
    finally:
        logging.disable(logging.NOTSET)
    assert counts["jit"].total() == counts["dispatch"].total() > 0
    assert not counts["jit"].unsupported_ops() and not counts["dispatch"].unsupported_ops()
    assert counts["jit"].by_module() == counts["dispatch"].by_module()


def test_meta_device_and_no_compute_count_the_same_bytes():
    model, args, _ = all_examples()["transformer"].instantiate("cpu")
    real = _bytes(model, *args).total()
    assert _bytes(model, *args, compute=False).total() == real
    meta_model, meta_args, _ = all_examples()["transformer"].instantiate("meta")
    assert _bytes(meta_model, *meta_args).total() == real


# -------------------------------------------------------------- torch's op database

common_methods_invocations = pytest.importorskip("torch.testing._internal.common_methods_invocations")
from test_op_database import OP_IDS, OPS, OpModule, _runnable_samples  # noqa: E402


RETURNED_AS_GIVEN = {
    "cartesian_prod": "with one input, its input returned as it is: the dispatch backend sees no op, the JIT one",
    "repeat_interleave": "with repeats of 1, a copy to the contiguous format under dispatch (a layout copy: 0), one op under the JIT",
}
"""Ops whose samples the two front ends see as different work, and why."""


class TensorBytes(TorchDispatchMode):
    """The independent count: for every op as it runs, the bytes (elements x element size) of the
    tensors it takes and returns, 0-dim tensors apart, per op kind."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int, int, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        read = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        written = [t for t in tree_leaves(result) if isinstance(t, torch.Tensor)]

        def size(tensors):
            return sum(t.numel() * t.element_size() for t in tensors if t.dim() > 0)

        scalars = sum(t.numel() * t.element_size() for t in read + written if t.dim() == 0)
        self.calls.append((func._schema.name, size(read), size(written), size(written[:1]), scalars))
        return result


def _reason(kind: str) -> str | None:
    """Why the convention's count of ``kind`` differs from every tensor read and written."""
    if kind in METADATA_OPS:
        return "a view, size or allocation: no data moves"
    if kind in FIRST_OUTPUT_ONLY:
        return "outputs after the first are statistics kept for the backward"
    if kind in BYTES_FORMULAS.kinds():
        return "its family's formula: a gather reads the rows it uses, a cast to its own dtype or a layout copy moves nothing"
    return None


@pytest.mark.parametrize("info", OPS, ids=OP_IDS)
def test_every_op_has_a_byte_count_held_against_its_tensors(info):
    """No op of the forward sweep is unsupported under either front end; both give the same total
    where they see the same ops, and where one keeps a composite whole that the other sees decomposed
    (most often the JIT), the fewer kernels move no more. Against the independent count: an op kind both see counts every tensor it reads
    and writes (0-dim scalars apart), or, where its convention differs by a named reason (a view, a
    gather, a fused kernel's statistics), no more; a composite op the dispatch backend records whole
    (``rms_norm``, ``outer``, the FFTs and ``linalg`` functions) counts as one kernel, no more than
    the ops it runs."""
    logging.disable(logging.WARNING)
    try:
        for args, kwargs in _runnable_samples(info):
            model = OpModule(info.op, kwargs)
            dispatch = _bytes(model, *args, backend="dispatch")
            jit = _bytes(model, *args, backend="jit")
            assert not dispatch.unsupported_ops() and not jit.unsupported_ops(), (dispatch.unsupported_ops(), jit.unsupported_ops())
            if set(jit.by_operator()) == set(dispatch.by_operator()) or info.name in RETURNED_AS_GIVEN:
                assert jit.total() == dispatch.total() or info.name in RETURNED_AS_GIVEN, (dict(jit.by_operator()), dict(dispatch.by_operator()))
            else:  # a composite one front end keeps whole and the other sees decomposed: the fewer kernels move no more
                fewer, more = sorted((jit, dispatch), key=lambda analysis: sum(op.count > 0 for op in analysis.op_counts()))
                assert fewer.total() <= more.total(), (dict(jit.by_operator()), dict(dispatch.by_operator()))
            independent = TensorBytes()
            with independent:
                info.op(*args, **kwargs)
            tensors: dict[str, int] = defaultdict(int)
            reasons: dict[str, str] = {}
            for kind, read, written, _, _ in independent.calls:
                tensors[short_op_name(kind)] += read + written
                if _reason(kind):
                    reasons[short_op_name(kind)] = _reason(kind)
            ours = dispatch.by_operator()
            for op in ours.keys() & tensors.keys():
                if op in reasons:
                    assert ours[op] <= tensors[op], f"{op} ({reasons[op]}): ours {ours[op]} above its tensors {tensors[op]}"
                else:
                    assert ours[op] == tensors[op], f"{op}: ours {ours[op]}, its tensors {tensors[op]}"
            whole = sum(ours[op] for op in ours.keys() - tensors.keys())
            assert whole <= sum(tensors[op] for op in tensors.keys() - ours.keys()), (dict(ours), dict(tensors))
    finally:
        logging.disable(logging.NOTSET)


def test_the_module_table_shows_bytes_and_intensity():
    """``flop_count_table(flops, traffic=True)``: each module's bytes (its ops' traffic, from the
    count's recording) and FLOPs per byte (2 x #flops / #bytes)."""
    from jitflops import FlopCountAnalysis, flop_count_table

    linear, x = nn.Linear(64, 32, bias=False), torch.randn(8, 64)
    table = flop_count_table(FlopCountAnalysis(linear, x), traffic=True).splitlines()
    moved = _size(8, 64) + _size(32, 64) + _size(8, 32)
    assert [cell.strip() for cell in table[0].split("|")][3:6] == ["#flops", "#bytes", "#FLOP/byte"]
    row = [cell.strip() for cell in table[2].split("|")]
    assert row[1] == "model" and row[4] == f"{moved / 1e3:g}K" and row[5] == f"{2 * 8 * 64 * 32 / moved:.3g}"


def test_the_op_table_has_each_ops_bytes_and_intensity():
    """The per-op table (``--ops``): each timed op with the bytes its count gave it and FLOPs per
    byte; every counted byte lands on one row."""
    from jitflops import profile_model

    model, args, kwargs = all_examples()["transformer"].instantiate("cpu")
    rows = profile_model(model, args, kwargs, repeats=1, with_ops=True).op_rows
    assert sum(row.bytes or 0 for row in rows) == _bytes(model, *args).total()
    linear = next(row for row in rows if row.op == "aten::linear" and row.module == "blocks.0.attention.q")
    assert linear.bytes == _size(1, 128, 64) + _size(64, 64) + _size(64) + _size(1, 128, 64) and linear.intensity == pytest.approx(linear.flops / linear.bytes)
    assert all(row.bytes is None for row in rows if row.op in ("aten::view", "aten::transpose", "aten::permute"))
