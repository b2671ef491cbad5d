"""Counting without computing: the default trace runs on meta values where that pays off, falls
back to real values where the model needs them, and gives the counts a trace on real values gives."""

from __future__ import annotations

import logging
import threading
import warnings

import pytest
import torch
from torch import nn

from jitflops import ActivationCountAnalysis, DataDependentTraceWarning, FlopCountAnalysis, JitflopsError
from jitflops.examples import ConvNet
from jitflops.core.model_io import ModelCall
from jitflops.frontends.meta_values import COMPUTE_BELOW_WORK, estimated_work

from helpers import assert_same_state, model_state

transformers = pytest.importorskip("transformers")


def _seen_devices(model: nn.Module) -> list[str]:
    """Records the device of every input the model's forward receives (the hook is shared with any
    copy of the model that is traced)."""
    seen: list[str] = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(next(t for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)).device.type), with_kwargs=True)
    return seen


def _bert() -> nn.Module:
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=256, vocab_size=30522)
    return transformers.BertModel(config).eval()


IDS = torch.randint(0, 30522, (8, 512))


def test_a_large_model_is_counted_on_meta_values_with_the_counts_of_real_ones():
    model = _bert()
    assert estimated_work(list(model.parameters()), ModelCall((IDS,))) > COMPUTE_BELOW_WORK
    seen = _seen_devices(model)
    before = model_state(model)
    default = FlopCountAnalysis(model, IDS)
    by_module = default.by_module_and_operator()
    assert seen == ["meta", "meta"]  # run untraced, then traced (scoped_trace._checked_meta_trace)
    real = FlopCountAnalysis(model, IDS, compute=True)
    assert by_module == real.by_module_and_operator() and seen == ["meta", "meta", "cpu"]
    assert default.unsupported_ops() == real.unsupported_ops() and default.uncalled_modules(False) == real.uncalled_modules(False)
    assert ActivationCountAnalysis(model, IDS).by_module() == ActivationCountAnalysis(model, IDS, compute=True).by_module()
    assert_same_state(before, model_state(model))


def test_a_small_call_computes_unless_asked_not_to_and_convolutions_trace_on_meta():
    model = ConvNet().eval()
    x = torch.randn(2, 3, 16, 16)
    seen = _seen_devices(model)
    real = FlopCountAnalysis(model, x).by_module_and_operator()
    assert seen == ["cpu"]
    assert FlopCountAnalysis(model, x, compute=False).by_module_and_operator() == real and seen == ["cpu", "meta", "meta"]
    transposed = nn.Sequential(nn.Conv2d(3, 8, 3, padding="same"), nn.ConvTranspose2d(8, 4, 3, stride=2), nn.Flatten())
    assert FlopCountAnalysis(transposed, x, compute=False).by_module_and_operator() == FlopCountAnalysis(transposed, x, compute=True).by_module_and_operator()


def test_a_small_network_on_a_large_image_is_traced_on_meta_values():
    """Its parameters x patches are small, but its convolutions run at every pixel."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    seen = _seen_devices(model)
    small = FlopCountAnalysis(model, torch.randn(1, 3, 64, 64)).total()
    assert seen == ["cpu"] and small == 62 * 62 * 4 * 27
    assert FlopCountAnalysis(model, torch.randn(1, 3, 1536, 1536)).total() == 1534 * 1534 * 4 * 27
    assert seen[1:] == ["meta", "meta"]


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1024, 1024)

    def forward(self, x):
        y = self.linear(x)
        return y * 2 if y.sum() > 0 else y


class MixesACpuConstant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1024, 1024)

    def forward(self, x):
        return self.linear(x) + torch.ones(x.shape[-1])  # made on the CPU whatever the inputs' device


class PadsByAValue(nn.Module):
    """Mimi's and EnCodec's convolutions: a padding computed from a buffer, a tensor inside ``F.pad``'s list."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1024, 1024)
        self.register_buffer("stride", torch.tensor(3))

    def forward(self, x):
        extra = torch.ceil(x.shape[-1] / self.stride).to(torch.int64) * self.stride - x.shape[-1]
        return nn.functional.pad(self.linear(x), (0, extra))


@pytest.mark.parametrize("model_class, reason", [(DataDependent, "Tensor.item"), (MixesACpuConstant, ""), (PadsByAValue, "Tensor.item")])
def test_models_that_need_real_values_fall_back_with_the_same_counts(model_class, reason, caplog):
    """The JIT counts them on real values; a failed meta trace leaves the thread's tracer clean (a
    tensor in a list of sizes once left torch's argument stash dirty, and every later trace of the
    thread failed inside torch, the dispatch backend counting them)."""
    model = model_class().eval()
    x = torch.randn(16384, 1024)
    assert estimated_work(list(model.parameters()), ModelCall((x,))) > COMPUTE_BELOW_WORK
    with caplog.at_level(logging.DEBUG, logger="jitflops.frontends.scoped_trace"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        analysis = FlopCountAnalysis(model, x)
        default = analysis.by_module_and_operator()
    assert analysis.counted_by == "jit" and FlopCountAnalysis(model, x).counted_by == "jit"
    assert default == FlopCountAnalysis(model, x, compute=True).by_module_and_operator()
    assert any("traced on real values: the trace on meta values failed" in r.message and reason in r.message for r in caplog.records)
    assert (model_class is DataDependent) == any(issubclass(w.category, DataDependentTraceWarning) for w in caught)
    with pytest.raises(JitflopsError, match=r"cannot be traced without real values \(compute=False\)"):
        FlopCountAnalysis(model, x, compute=False).total()


def test_convolutions_built_on_the_meta_device_are_counted():
    x = torch.randn(2, 3, 16, 16)
    real = FlopCountAnalysis(ConvNet().eval(), x).by_module_and_operator()
    on_meta = ConvNet().to("meta").eval()
    assert FlopCountAnalysis(on_meta, x.to("meta")).by_module_and_operator() == real
    assert all(p.device.type == "meta" for p in on_meta.parameters())


def test_the_model_stays_usable_by_other_threads_while_it_is_counted():
    model = _bert()
    reference = model(IDS).last_hidden_state
    failures: list[BaseException] = []
    stop = threading.Event()

    def infer() -> None:
        while not stop.is_set():
            try:
                with torch.no_grad():
                    assert torch.equal(model(IDS).last_hidden_state, reference)
            except BaseException as error:  # reported below
                failures.append(error)
                return

    worker = threading.Thread(target=infer)
    worker.start()
    try:
        for _ in range(3):
            FlopCountAnalysis(model, IDS).total()
    finally:
        stop.set()
        worker.join()
    assert failures == []


@pytest.mark.parametrize("name, args", [
    ("addmm", (torch.randn(5), torch.randn(3, 4), torch.randn(4, 5))),
    ("native_layer_norm", (torch.randn(2, 3, 8), [8], torch.randn(8), torch.randn(8), 1e-5)),
    ("native_layer_norm", (torch.randn(2, 3, 8, dtype=torch.bfloat16), [3, 8], None, None, 1e-5)),
    ("_safe_softmax", (torch.randn(2, 4, 6), -1)),
    *[(name, (torch.randn(2, 4, 5, 5), torch.randn(4), torch.randn(4), torch.randn(4), torch.rand(4), training, 0.1, 1e-5))
      for name in ("native_batch_norm", "_native_batch_norm_legit") for training in (False, True)],
    ("_native_batch_norm_legit_no_training", (torch.randn(2, 4, 5, 5), torch.randn(4), torch.randn(4), torch.randn(4), torch.rand(4), 0.1, 1e-5)),
    ("native_batch_norm", (torch.randn(2, 4, 5, 5, dtype=torch.bfloat16), None, None, None, None, True, 0.1, 1e-5)),
    ("hardtanh", (torch.randn(2, 3, 4), 0.0, 6.0)),
    ("hardtanh_", (torch.randn(2, 3, 4), 0.0, 6.0)),
    ("relu", (torch.randn(2, 3, 4, dtype=torch.bfloat16),)),
    ("relu_", (torch.randn(2, 3, 4),)),
    ("gelu", (torch.randn(2, 3, 4),)),
    ("hardswish", (torch.randn(2, 3, 4),)),
    ("hardsigmoid_", (torch.randn(2, 3, 4),)),
    *[("convolution", (torch.randn(2, 4, 9, 9), torch.randn(6, 2, 3, 3), bias, [2, 1], [1, 0], [1, 2], False, [0, 0], 2)) for bias in (None, torch.randn(6))],
    ("convolution", (torch.randn(2, 4, 9), torch.randn(4, 1, 5), None, [1], [2], [1], False, [0], 4)),
    ("convolution", (torch.randn(2, 4, 5, 5), torch.randn(4, 3, 3, 3), None, [2, 2], [1, 1], [1, 1], True, [1, 1], 1)),
    *[(f"{op}.Tensor", (torch.randn(2, 3, 4, dtype=dtype), other))
      for op in ("add", "sub", "mul") for dtype in (torch.float32, torch.bfloat16)
      for other in (torch.randn(2, 3, 4, dtype=dtype), torch.tensor(2.5, dtype=torch.float64), torch.tensor(3), torch.randn(4))],
    ("add.Tensor", (torch.randint(5, (2, 3)), torch.randint(5, (2, 3)))),
    *[(f"{op}.Tensor", pair) for op in ("add", "mul") for pair in (  # broadcast: a norm's scale first, rotary cosines, a variance
        (torch.randn(8), torch.randn(2, 3, 8)), (torch.randn(2, 4, 3, 8), torch.randn(2, 1, 3, 8)), (torch.randn(2, 3, 1), torch.randn(1, 3, 8)))],
    ("sub.Tensor", (2, torch.randn(2, 3))),
    ("mul.Tensor", (torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64))),
    ("mul.Tensor", (torch.randn(3, 2).t(), torch.randn(2, 3))),
    ("tril", (torch.randn(3, 4, 5),)),
    ("mean.dim", (torch.randn(2, 8, 5, 5), [-1, -2], True)),
    ("mean.dim", (torch.randn(2, 8, 5), [1])),
    ("mean.dim", (torch.randn(2, 8, 5, dtype=torch.bfloat16), [0, 2])),
    ("mean.dim", (torch.randn(4, 3), [])),
    ("triu", (torch.randn(4, 4), 1)),
])
def test_jitflops_meta_kernels_give_what_the_cpu_kernels_give(name, args):
    """The meta kernels of a meta trace stand in for the CPU kernels a trace on real values runs:
    the same shapes and dtypes (and layout, where a later view depends on it). A 0-dim tensor stays
    on the CPU, as a number does when torch passes it to a kernel."""
    from jitflops.frontends.meta_values import TRACING_META_KERNELS

    on_meta = [a.to("meta") if isinstance(a, torch.Tensor) and a.dim() else a for a in args]
    op, _, overload = name.partition(".")
    theirs = getattr(getattr(torch.ops.aten, op), overload or "default")(*args)
    ours = TRACING_META_KERNELS[name](*on_meta)
    for mine, real in zip(ours if isinstance(ours, tuple) else (ours,), theirs if isinstance(theirs, tuple) else (theirs,)):
        assert (mine.shape, mine.dtype, mine.device.type) == (real.shape, real.dtype, "meta")
        assert mine.is_contiguous() == real.is_contiguous()


def _layouts() -> list[torch.Tensor]:
    """A contiguous tensor, a transposed one (a rotary embedding's q), a slice with gaps (rotate_half's
    halves), an expanded one, a channels-last one and a bfloat16 one."""
    base = torch.randn(2, 5, 3, 8)
    return [base, base.transpose(1, 2), base[..., :4], torch.randn(1, 3, 1).expand(2, 3, 4), base.to(memory_format=torch.channels_last),
            base.to(torch.bfloat16).transpose(1, 2)]


@pytest.mark.parametrize("name, extra", [("neg", ()), ("rsqrt", ()), ("pow.Tensor_Scalar", (2,)), ("pow.Tensor_Scalar", (0.5,))])
def test_jitflops_unary_meta_kernels_lay_their_output_out_as_the_cpu_does(name, extra):
    """Shape, dtype and strides, input by input, as the CPU's kernel gives them (a view after a norm or
    a rotary embedding depends on the strides)."""
    from jitflops.frontends.meta_values import TRACING_META_KERNELS

    op, _, overload = name.partition(".")
    for tensor in _layouts():
        real = getattr(getattr(torch.ops.aten, op), overload or "default")(tensor.abs() + 1, *extra)
        mine = TRACING_META_KERNELS[name](tensor.to("meta"), *extra)
        assert (mine.shape, mine.dtype, mine.stride()) == (real.shape, real.dtype, real.stride()), (name, tensor.stride())
    integer = torch.arange(6).reshape(2, 3).to("meta")  # not floating: torch's own reference
    assert TRACING_META_KERNELS[name](integer, *extra).dtype == getattr(getattr(torch.ops.aten, op), overload or "default")(torch.arange(6).reshape(2, 3), *extra).dtype


def test_jitflops_meta_kernels_refuse_what_torch_refuses():
    from jitflops.frontends.meta_values import TRACING_META_KERNELS

    meta = lambda *shape: torch.empty(*shape, device="meta")  # noqa: E731
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        TRACING_META_KERNELS["addmm"](meta(5), meta(3, 4), meta(5, 5))
    with pytest.raises(RuntimeError, match="normalized_shape"):
        TRACING_META_KERNELS["native_layer_norm"](meta(2, 3, 8), [4], None, None, 1e-5)
    with pytest.raises(IndexError):
        TRACING_META_KERNELS["_safe_softmax"](meta(2, 3), 2)
    with pytest.raises(RuntimeError, match="running_mean should contain 4 elements not 3"):
        TRACING_META_KERNELS["native_batch_norm"](meta(2, 4, 5), None, None, meta(3), meta(3), False, 0.1, 1e-5)
    with pytest.raises(RuntimeError, match="Invalid channel dimensions"):  # the checks left to torch's meta kernel
        TRACING_META_KERNELS["convolution"](meta(2, 4, 9, 9), meta(6, 3, 3, 3), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    with pytest.raises(RuntimeError, match="Kernel size can't be greater than actual input size"):
        TRACING_META_KERNELS["convolution"](meta(2, 4, 2, 2), meta(6, 4, 3, 3), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    with pytest.raises(RuntimeError, match="broadcast"):
        TRACING_META_KERNELS["add.Tensor"](meta(2, 3), meta(2, 4))
    with pytest.raises(IndexError):
        TRACING_META_KERNELS["mean.dim"](meta(2, 3), [2])
    with pytest.raises(RuntimeError, match="tril"):
        TRACING_META_KERNELS["tril"](meta(5))
    with pytest.raises(RuntimeError, match="running_mean should contain 4 elements not 3"):  # torch's words (its composite batch_norm checks)
        torch.nn.functional.batch_norm(torch.randn(2, 4, 5), torch.zeros(3), torch.ones(3))
