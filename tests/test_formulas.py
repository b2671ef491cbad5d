"""Every formula against a hand-derived count, through a real trace of the op."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from jitflops import FlopCountAnalysis
from jitflops.handles.einsum import einsum_macs

from helpers import activations_of, flops_of


# ---------------------------------------------------------------- matrix products

@pytest.mark.parametrize(
    "a, b, expected",
    [
        ((5,), (5,), 5),  # dot
        ((3, 5), (5,), 15),  # matrix @ vector
        ((5,), (5, 7), 35),  # vector @ matrix
        ((2, 3, 5), (5,), 30),  # batched matrix @ vector
        ((5,), (4, 5, 7), 140),  # vector @ batched matrix
        ((3, 5), (5, 7), 105),
        ((4, 3, 5), (5, 7), 420),
        ((3, 5), (4, 5, 7), 420),  # broadcast batch on the right: fvcore counts 105
        ((2, 1, 3, 5), (4, 5, 7), 840),  # broadcast both sides
    ],
)
def test_matmul_any_rank(a, b, expected):
    flops = flops_of(torch.matmul, torch.randn(a), torch.randn(b))
    assert flops.total() == expected
    assert flops.by_operator() == {"matmul": expected}


def test_mm_and_its_activations():
    a, b = torch.randn(6, 4), torch.randn(4, 9)
    assert flops_of(torch.mm, a, b).by_operator() == {"mm": 6 * 4 * 9}
    assert activations_of(torch.mm, a, b).by_operator() == {"mm": 6 * 9}


def test_matmul_operator_and_inplace_add_are_traced():
    def f(x, w):
        y = x @ w
        y += 1
        return y

    assert flops_of(f, torch.randn(8, 16), torch.randn(16, 4)).total() == 8 * 16 * 4
    assert flops_of(f, torch.randn(8, 16), torch.randn(16, 4), elementwise=True).by_operator() == {"matmul": 512, "add_": 32}


def test_baddbmm_counts_the_product_only():
    bias, a, b = torch.randn(3, 4, 6), torch.randn(3, 4, 5), torch.randn(3, 5, 6)
    assert flops_of(torch.baddbmm, bias, a, b).by_operator() == {"baddbmm": 3 * 4 * 5 * 6}
    assert activations_of(torch.baddbmm, bias, a, b).total() == 3 * 4 * 6


def test_addmm_bmm_linear():
    assert flops_of(torch.addmm, torch.randn(7), torch.randn(3, 5), torch.randn(5, 7)).total() == 105
    assert flops_of(torch.bmm, torch.randn(2, 3, 5), torch.randn(2, 5, 7)).total() == 210
    assert flops_of(F.linear, torch.randn(2, 3, 5), torch.randn(7, 5)).by_operator() == {"linear": 2 * 3 * 5 * 7}


# ---------------------------------------------------------------------- einsum

@pytest.mark.parametrize(
    "equation, shapes, expected",
    [
        ("ij,jk->ik", [(3, 4), (4, 5)], 60),
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], 120),
        ("i,i->", [(7,)], None),  # operand count mismatch: error
        ("i,j->ij", [(3,), (4,)], 0),  # outer product: torch runs a mul; fvcore says 6
        ("ij,ij->ij", [(3, 4), (3, 4)], 0),  # Hadamard product: a mul; fvcore says 6
        ("ij,ij->i", [(3, 4), (3, 4)], 12),  # row-wise dot products: one bmm
        ("ij->ji", [(3, 4)], 0),  # transpose costs nothing; fvcore says 6
        ("ii->i", [(5, 5)], 0),  # diagonal
        ("ii", [(5, 5)], 0),  # trace: a sum
        ("ij,jk->i", [(3, 4), (4, 5)], 12),  # k is summed out of the right operand before the product
        ("...ij,...jk->...ik", [(2, 6, 3, 4), (6, 4, 5)], 2 * 6 * 3 * 4 * 5),  # ellipsis with broadcast
        ("bij,jk->bik", [(1, 3, 4), (4, 5)], 60),  # size-1 batch
        ("ij,jk", [(3, 4), (4, 5)], 60),  # implicit output "ik"
        ("ij,jk,kl->il", [(50, 2), (2, 50), (50, 3)], 50 * 2 * 50 + 50 * 50 * 3),  # left to right, as torch without opt_einsum
        ("b h i d, b h j d -> b h i j", [(1, 2, 3, 4), (1, 2, 5, 4)], 120),  # spaces
        ("Aij,...jk->...ik", [(2, 3, 4), (2, 4, 5)], 120),  # an upper-case index beside an ellipsis
    ],
)
def test_einsum_equations(equation, shapes, expected):
    """Checked against the products torch's einsum runs (FlopCounterMode) and both backends."""
    if expected is None:
        with pytest.raises(ValueError):
            einsum_macs(equation, shapes)
        return
    assert einsum_macs(equation, shapes) == expected
    tensors = [torch.randn(shape) for shape in shapes]
    with FlopCounterMode(display=False) as torch_count:
        torch.einsum(equation, *tensors)
    assert torch_count.get_total_flops() == 2 * expected
    for backend in ("jit", "dispatch"):
        assert flops_of(lambda *ts: torch.einsum(equation, *ts), *tensors, backend=backend).total() == expected


def test_einsum_follows_the_recorded_contraction_path():
    # the path opt_einsum would give torch: contract operands 1 and 2 first, then the result with 0
    assert einsum_macs("ij,jk,kl->il", [(50, 2), (2, 50), (50, 3)], path=[1, 2, 0, 1]) == 2 * 50 * 3 + 50 * 2 * 3


# ---------------------------------------------------------------- convolutions

@pytest.mark.parametrize(
    "conv, shape",
    [
        (nn.Conv1d(4, 8, 3), (2, 4, 20)),
        (nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2), (2, 4, 16, 16)),
        (nn.Conv3d(2, 4, (1, 3, 3)), (1, 2, 4, 8, 8)),
        (nn.ConvTranspose2d(4, 6, 3, stride=2), (1, 4, 5, 5)),
    ],
)
def test_convolution(conv, shape):
    x = torch.randn(shape)
    out = conv(x)
    positions = (x.shape if isinstance(conv, nn.ConvTranspose2d) else out.shape)[2:]
    expected = x.shape[0] * conv.weight.numel() * torch.Size(positions).numel()
    analysis = FlopCountAnalysis(conv, x)
    assert analysis.by_operator() == {"conv": expected}


# ----------------------------------------------------------------- normalisation

@pytest.mark.parametrize("rank", [2, 3, 4, 5, 6])
def test_layer_and_group_norm_any_rank(rank):
    shape = (2, 4) + (3,) * (rank - 2)
    x = torch.randn(shape)
    numel = x.numel()
    assert flops_of(lambda t: F.layer_norm(t, shape[-1:], torch.ones(shape[-1]), torch.zeros(shape[-1])), x).total() == 5 * numel
    assert flops_of(lambda t: F.layer_norm(t, shape[-1:]), x).total() == 4 * numel
    assert flops_of(lambda t: F.group_norm(t, 2), x).total() == 4 * numel


def test_rms_norm_with_and_without_weight():
    x = torch.randn(2, 3, 8)
    assert flops_of(lambda t: F.rms_norm(t, (8,), torch.ones(8)), x).by_operator() == {"rms_norm": 4 * 48}
    assert flops_of(lambda t: F.rms_norm(t, (8,)), x).total() == 3 * 48


def test_batch_norm_training_and_eval():
    bn = nn.BatchNorm3d(4)
    x = torch.randn(2, 4, 3, 3, 3)
    assert FlopCountAnalysis(bn.train(), x).total() == 5 * x.numel()
    assert FlopCountAnalysis(bn.eval(), x).total() == 2 * x.numel()


@pytest.mark.parametrize("kernel", ["cudnn", "miopen"])
def test_gpu_batch_norm_kernels_count_as_the_native_ones(kernel):
    """A GPU runs float32 batch norms through cuDNN's (MIOpen's) kernel: the dispatch backend on an
    H100 left ``cudnn_batch_norm`` uncounted in ResNet-50. Eval 2 and training 5 per element, as
    the native forms; its backward serves batch statistics only, twice the training forward."""
    aten, x, w = torch.ops.aten, torch.empty(2, 4, 8, 8, device="meta"), torch.empty(4, device="meta")
    forward, backward = getattr(aten, f"{kernel}_batch_norm"), getattr(aten, f"{kernel}_batch_norm_backward")
    assert _kernel_count(forward, (x, w, w, w, w), False, 0.1, 1e-5) == {f"{kernel}_batch_norm": 2 * x.numel()}
    assert _kernel_count(forward, (x, w, w, w, w), True, 0.1, 1e-5) == {f"{kernel}_batch_norm": 5 * x.numel()}
    reserve = (torch.empty(0, dtype=torch.uint8, device="meta"),) if kernel == "cudnn" else ()
    assert _kernel_count(backward, (x, x, w, w, w, w, w), 1e-5, *reserve) == {f"{kernel}_batch_norm_backward": 10 * x.numel()}


def test_instance_norm_5d():
    x = torch.randn(2, 3, 4, 4, 4)
    assert FlopCountAnalysis(nn.InstanceNorm3d(3, affine=True), x).total() == 5 * x.numel()


# ---------------------------------------------------------------------- attention

def _sdpa_expected(batch_heads: int, length: int, source: int, head_dim: int, value_dim: int) -> int:
    return batch_heads * length * source * (head_dim + value_dim)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_dense_and_causal_count_the_same(causal):
    q, k, v = torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)
    flops = flops_of(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal), q, k, v)
    assert flops.by_operator() == {"scaled_dot_product_attention": _sdpa_expected(8, 16, 16, 8, 8)}


def test_sdpa_with_mask_and_different_value_dim():
    q, k, v = torch.randn(1, 2, 10, 8), torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 6)
    mask = torch.ones(10, 12, dtype=torch.bool).tril()
    flops = flops_of(lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, attn_mask=m), q, k, v, mask)
    assert flops.total() == _sdpa_expected(2, 10, 12, 8, 6)


@pytest.mark.parametrize("kv_heads", [1, 2])  # multi-query and grouped-query
def test_sdpa_grouped_and_multi_query(kv_heads):
    q, k, v = torch.randn(1, 8, 16, 4), torch.randn(1, kv_heads, 16, 4), torch.randn(1, kv_heads, 16, 4)
    flops = flops_of(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, enable_gqa=True), q, k, v)
    assert flops.total() == _sdpa_expected(8, 16, 16, 4, 4)


def test_sdpa_activations_are_the_output():
    q = torch.randn(1, 2, 5, 4)
    assert activations_of(F.scaled_dot_product_attention, q, q, q).total() == q.numel()


class _KernelCall(nn.Module):
    """One raw CUDA attention kernel (what varlen and nested-tensor attention call), run on meta."""

    def __init__(self, kernel, *arguments) -> None:
        super().__init__()
        self.kernel, self.arguments = kernel, arguments

    def forward(self, *tensors):
        return self.kernel(*tensors, *self.arguments)[0]


def _kernel_count(kernel, tensors, *arguments, attention="dense"):
    module = _KernelCall(kernel, *arguments)
    return FlopCountAnalysis(module, tensors, backend="dispatch", attention=attention).unsupported_ops_warnings(False).by_operator()


# torch's test_flash_attention_forward_flop_layout shape: B=2, H=8, S=128 (D=64: the 33,554,432)
B, S, H = 2, 128, 8


@pytest.mark.parametrize("head_dim, value_dim", [(128, 128), (64, 64), (64, 32)])
def test_flash_and_efficient_kernels_count_in_their_sequence_first_layout(head_dim, value_dim):
    """(batch, sequence, heads, dim): B·H·S·S·(E + Ev) MACs forward; the backward's five products,
    the gradients' four under ``backward.`` and the recomputed scores under ``recompute.``:
    2·B·H·S²·(3·E + 2·Ev) FLOPs in all, as FlopCounterMode's sdpa_backward_flop_count charges."""
    aten = torch.ops.aten
    q, k = torch.empty(B, S, H, head_dim, device="meta"), torch.empty(B, S, H, head_dim, device="meta")
    v = torch.empty(B, S, H, value_dim, device="meta")
    out, logsumexp = torch.empty(B, S, H, value_dim, device="meta"), torch.empty(B, H, S, device="meta")
    forward = B * H * S * S * (head_dim + value_dim)
    assert (head_dim, value_dim) != (64, 64) or forward == 33_554_432
    assert _kernel_count(aten._flash_attention_forward, (q, k, v), None, None, S, S, 0.0, False, False) == {"_flash_attention_forward": forward}
    assert _kernel_count(aten._efficient_attention_forward, (q, k, v), None, None, None, S, S, 0.0, 0) == {"_efficient_attention_forward": forward}
    empty, seed = torch.empty(0, device="meta", dtype=torch.long), torch.empty((), device="meta", dtype=torch.long)
    five = {"backward": 2 * forward, "recompute": B * H * S * S * head_dim}
    assert 2 * sum(five.values()) == 2 * B * H * S * S * (3 * head_dim + 2 * value_dim)
    flash = _kernel_count(aten._flash_attention_backward, (out, q, k, v, out, logsumexp, empty, empty), S, S, 0.0, False, seed, seed)
    assert flash == {"_flash_attention_backward": five["backward"], "recompute._flash_attention_backward": five["recompute"]}
    efficient = _kernel_count(aten._efficient_attention_backward, (out, q, k, v, None, out, None, None), S, S, logsumexp, 0.0, seed, seed, 0, False)
    assert efficient == {"_efficient_attention_backward": five["backward"], "recompute._efficient_attention_backward": five["recompute"]}


def test_a_fused_sdpa_kernels_backward_counts_what_flop_counter_mode_counts():
    """SDPA's memory-efficient kernel's backward, in its own (batch, heads, sequence, dim) layout:
    the four gradient products and the recomputed scores, 167,772,160 FLOPs for B=2, H=8, S=128,
    D=64, as ``FlopCounterMode``'s ``sdpa_backward_flop_count`` (an independent count) has them."""
    q, out = torch.empty(B, H, S, 64, device="meta"), torch.empty(B, H, S, 64, device="meta")
    logsumexp, seed = torch.empty(B, H, S, device="meta"), torch.empty((), dtype=torch.long, device="meta")
    backward = _KernelCall(torch.ops.aten._scaled_dot_product_efficient_attention_backward, seed, seed, 0.0, (True, True, True, False))
    with FlopCounterMode(display=False) as torch_count:
        backward(out, q, q, q, None, out, logsumexp)
    ours = _kernel_count(torch.ops.aten._scaled_dot_product_efficient_attention_backward, (out, q, q, q, None, out, logsumexp), seed, seed, 0.0, (True, True, True, False))
    assert ours == {"_scaled_dot_product_efficient_attention_backward": 4 * B * H * S * S * 64, "recompute._scaled_dot_product_efficient_attention_backward": B * H * S * S * 64}
    assert 2 * sum(ours.values()) == torch_count.get_total_flops() == 167_772_160


def test_flash_and_efficient_kernels_causal_grouped_and_packed():
    """Grouped-query keys (2 heads for 8), a longer key than query, the kernels' causal flags under
    the mask-aware convention (top-left and bottom-right alignment), and packed sequences counted at
    their largest lengths (FlopCounterMode's bound on fake offsets)."""
    aten, L = torch.ops.aten, 96
    q, k = torch.empty(B, L, H, 64, device="meta"), torch.empty(B, S, 2, 64, device="meta")
    dense = B * H * L * S * 128
    assert _kernel_count(aten._flash_attention_forward, (q, k, k), None, None, L, S, 0.0, True, False) == {"_flash_attention_forward": dense}
    top_left = sum(min(i + 1, S) for i in range(L))
    bottom_right = sum(min(i + 1 + S - L, S) for i in range(L))
    counted = {
        mask_type: _kernel_count(aten._efficient_attention_forward, (q, k, k), None, None, None, L, S, 0.0, mask_type, attention="masked")["_efficient_attention_forward"]
        for mask_type in (0, 1, 2)
    }
    assert counted == {0: dense, 1: B * H * top_left * 128, 2: B * H * bottom_right * 128}
    flash = _kernel_count(aten._flash_attention_forward, (q, k, k), None, None, L, S, 0.0, True, False, attention="masked")
    assert flash == {"_flash_attention_forward": counted[1]}
    packed_q, packed_k = torch.empty(300, H, 64, device="meta"), torch.empty(300, H, 64, device="meta")
    offsets = torch.empty(4, dtype=torch.int32, device="meta")  # three sequences, the longest 150 tokens
    packed = _kernel_count(aten._flash_attention_forward, (packed_q, packed_k, packed_k, offsets, offsets), 150, 150, 0.0, False, False)
    assert packed == {"_flash_attention_forward": 3 * H * 150 * 150 * 128}


# ---------------------------------------------------------------------- recurrent

@pytest.mark.parametrize(
    "layer, gates",
    [(nn.LSTM(6, 5, num_layers=2, bidirectional=True), 4), (nn.GRU(6, 5, num_layers=2, bidirectional=True), 3), (nn.RNN(6, 5, num_layers=2, bidirectional=True), 1)],
)
def test_recurrent_layers(layer, gates):
    steps, batch, inputs, hidden = 7, 3, 6, 5
    per_token = gates * hidden * (inputs + hidden) * 2 + gates * hidden * (2 * hidden + hidden) * 2  # layer 1 sees both directions
    analysis = FlopCountAnalysis(layer, torch.randn(steps, batch, inputs))
    assert analysis.total() == steps * batch * per_token
    assert analysis.unsupported_ops() == {}


def test_lstm_with_projection_and_batch_first():
    lstm = nn.LSTM(6, 8, proj_size=3, batch_first=True)
    per_token = 4 * 8 * 6 + 4 * 8 * 3 + 3 * 8  # w_ih, w_hh (on the projected state), w_hr
    assert FlopCountAnalysis(lstm, torch.randn(2, 5, 6)).total() == 10 * per_token


def test_lstm_cell():
    cell = nn.LSTMCell(6, 5)
    assert FlopCountAnalysis(cell, torch.randn(3, 6)).total() == 3 * 4 * 5 * (6 + 5)


# ------------------------------------------------------------- pooling, resampling

@pytest.mark.parametrize(
    "pool, shape",
    [
        (nn.MaxPool1d(3, stride=2), (2, 4, 21)),
        (nn.AvgPool1d(2), (2, 4, 20)),
        (nn.MaxPool2d(3, stride=2, padding=1), (1, 4, 16, 16)),
        (nn.AvgPool2d((2, 3)), (1, 4, 12, 12)),
        (nn.MaxPool3d(2), (1, 2, 8, 8, 8)),
        (nn.AvgPool3d((1, 2, 2)), (1, 2, 4, 8, 8)),
    ],
)
def test_windowed_pools(pool, shape):
    x = torch.randn(shape)
    kernel = pool.kernel_size if isinstance(pool.kernel_size, tuple) else (pool.kernel_size,) * (len(shape) - 2)
    assert FlopCountAnalysis(pool, x).total() == pool(x).numel() * torch.Size(kernel).numel()


@pytest.mark.parametrize(
    "pool, shape",
    [(nn.AdaptiveAvgPool1d(1), (2, 3, 8)), (nn.AdaptiveMaxPool2d(2), (2, 3, 8, 8)), (nn.AdaptiveAvgPool3d(1), (2, 3, 4, 4, 4))],
)
def test_adaptive_pools_read_every_input(pool, shape):
    x = torch.randn(shape)
    assert FlopCountAnalysis(pool, x).total() == x.numel()


@pytest.mark.parametrize(
    "mode, shape, per_output",
    [("nearest", (1, 2, 6, 6), 1), ("linear", (1, 2, 6), 2), ("bilinear", (1, 2, 6, 6), 4), ("bicubic", (1, 2, 6, 6), 16), ("trilinear", (1, 2, 4, 4, 4), 8)],
)
def test_upsampling(mode, shape, per_output):
    x = torch.randn(shape)
    out = F.interpolate(x, scale_factor=2, mode=mode)
    assert flops_of(lambda t: F.interpolate(t, scale_factor=2, mode=mode), x).total() == out.numel() * per_output


def test_grid_sample_by_mode():
    x, grid = torch.randn(1, 3, 8, 8), torch.rand(1, 5, 5, 2) * 2 - 1
    assert flops_of(lambda a, g: F.grid_sample(a, g, align_corners=False), x, grid).total() == 75 * 4
    assert flops_of(lambda a, g: F.grid_sample(a, g, mode="nearest", align_corners=False), x, grid).total() == 75


# ---------------------------------------------------------------- shape ops, elementwise

def test_shape_ops_cost_nothing_and_are_known():
    def f(x):
        y = x.unflatten(1, (4, 6)).permute(0, 2, 1).reshape(2, -1)
        y = torch.cat([y, y.flip(0)], dim=1)[:, ::2].contiguous().to(torch.float64)
        y = torch.stack(list(y.unbind(0))).squeeze().unsqueeze(0).expand(3, -1, -1)
        return y.mT[0].T.contiguous()

    analysis = flops_of(f, torch.randn(2, 24))
    assert analysis.total() == 0
    assert analysis.unsupported_ops() == {}


def test_elementwise_convention_is_off_by_default_and_counted_on_request():
    def f(x):
        return torch.softmax(F.gelu(x) * 2, dim=-1).sum(dim=0)

    x = torch.randn(4, 10)
    assert flops_of(f, x).total() == 0
    assert flops_of(f, x).unsupported_ops() == {}
    counted = flops_of(f, x, elementwise=True)
    assert counted.by_operator() == {"gelu": 40, "mul": 40, "softmax": 120, "sum": 40}
    assert "elementwise ops" in counted.convention() and "counted (1 flop per element)" in counted.convention()


# ------------------------------------------- products torch composes, in-place forms, decompositions


@pytest.mark.parametrize(
    "fn, shapes, expected",
    [
        (lambda a, b: torch.inner(a, b), [(3, 5), (4, 5)], 3 * 4 * 5),  # 2-D operands: one mm
        (lambda a, b: torch.tensordot(a, b, dims=([1], [0])), [(3, 5), (5, 6)], 3 * 5 * 6),
        (lambda a, b: torch.outer(a, b), [(3,), (4,)], 12),
        (lambda c, a, b: torch.addr(c, a, b), [(3, 4), (3,), (4,)], 12),
        (lambda c, a, b: c.clone().addmm_(a, b), [(3, 6), (3, 5), (5, 6)], 3 * 5 * 6),
        (lambda c, a, b: c.clone().baddbmm_(a, b), [(2, 3, 6), (2, 3, 5), (2, 5, 6)], 2 * 3 * 5 * 6),
        (lambda a, b, c: torch.linalg.multi_dot([a, b, c]), [(50, 2), (2, 50), (50, 3)], 2 * 50 * 3 + 50 * 2 * 3),
        (lambda a: torch.linalg.matrix_power(a, 5), [(4, 4)], 3 * 64),  # a^2, a^4, a^4 @ a
        (lambda a, b: torch.linalg.vecdot(a, b), [(3, 5), (3, 5)], 15),
        (lambda a, b, w: torch.nn.functional.bilinear(a, b, w), [(2, 3), (2, 4), (5, 3, 4)], 2 * 5 * 4 * (3 + 1)),
    ],
)
def test_composite_products_count_the_products_torch_runs(fn, shapes, expected):
    tensors = [torch.randn(shape) for shape in shapes]
    for backend in ("jit", "dispatch"):
        analysis = flops_of(fn, *tensors, backend=backend)
        assert analysis.total() == expected and not analysis.unsupported_ops(), backend
    with FlopCounterMode(display=False) as torch_count:
        fn(*tensors)
    assert torch_count.get_total_flops() in (0, 2 * expected)  # torch counts these products, or none of them


@pytest.mark.parametrize(
    "fn, shape, expected",
    [
        (torch.linalg.cholesky, (4, 4), round(4**3 / 6)),  # made positive definite below
        (torch.linalg.inv, (4, 4), 4**3),
        (torch.linalg.det, (4, 4), round((4 * 16 - 64 / 3) / 2)),
        (lambda a: torch.linalg.svdvals(a), (6, 4), round(2 * 6 * 16 - 2 * 64 / 3)),
        (lambda a: torch.fft.fft(a), (2, 8), 2 * 8 * 3),  # N log2 N over the 8-point transforms
        (lambda a: torch.fft.rfft2(a), (8, 4), 32 * 5),  # log2(8 x 4) = 5
        (lambda a: torch.cdist(a, a), (3, 4), 9 * 4),  # 3 x 3 pairs of 4 features, by the pairwise kernel
    ],
)
def test_decompositions_transforms_and_distances_by_hand(fn, shape, expected):
    a = torch.randn(shape)
    if fn is torch.linalg.cholesky:
        a = a @ a.T + 4 * torch.eye(4)
    for backend in ("jit", "dispatch"):
        assert flops_of(fn, a, backend=backend).total() == expected, backend


def test_formulas_of_torch_2_15s_new_decompositions_by_hand():
    """``linalg.matrix_sqrth`` and ``linalg.polar`` exist from torch 2.15 on; their formulas, on records."""
    from jitflops.handles.decompositions import matrix_sqrth_flops, polar_flops
    from jitflops.core.records import EagerOpRecord, TensorMeta

    square = [TensorMeta((5, 5))]
    assert matrix_sqrth_flops(EagerOpRecord("aten::linalg_matrix_sqrth", square, square, ("self",))) == round(9 / 2 * 125 + 125)
    assert polar_flops(EagerOpRecord("aten::linalg_polar", square, square * 2, ("A",))) == 7 * 125 + 4 * 125 + 125 + 125
