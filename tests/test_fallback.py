"""The default call counts every model that can be counted.

Where the JIT tracer cannot trace a model, the dispatch backend counts it, with one
``JitFallbackWarning`` naming the reason, and every report says which front end counted; where it
can, nothing changes (fvcore's numbers). ``strict=True`` keeps raising. The counts are checked
against hand formulas and against the dispatch backend asked for directly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from helpers import assert_same_state, model_state
from jitflops import FlopCountAnalysis, FlopsProfiler, JitFallbackWarning, JitflopsError, TraceError, flop_count_table, get_model_profile, profile_model
from jitflops.reports.deepspeed_report import format_model_profile
from jitflops.reports.files import profile_to_dict


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


MLP_MACS = 4 * (16 * 32 + 32 * 8)  # batch 4, by hand


def _quantized_mlp() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notice of eager-mode quantization
        return torch.ao.quantization.quantize_dynamic(_mlp(), {nn.Linear}, dtype=torch.qint8)


def _fallback_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, JitFallbackWarning)]


def test_a_traceable_model_is_counted_by_the_jit_without_a_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        analysis = FlopCountAnalysis(_mlp(), torch.randn(4, 16))
        assert analysis.total() == MLP_MACS
    assert analysis.counted_by == "jit" and analysis.fallback_reason is None and not _fallback_warnings(caught)
    assert "counted by" not in flop_count_table(analysis)


def test_a_quantized_model_is_counted_by_dispatch_with_one_warning_naming_the_module():
    model, x = _quantized_mlp(), torch.randn(4, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        analysis = FlopCountAnalysis(model, x).unsupported_ops_warnings(False)
        analysis.total(), analysis.by_module(), analysis.unsupported_ops()
    messages = _fallback_warnings(caught)
    assert len(messages) == 1 and "quantized" in messages[0] and "module '0'" in messages[0]
    assert analysis.counted_by == "dispatch" and "quantized" in analysis.fallback_reason
    # what the dispatch backend itself finds: the quantized products (integer work, not yet counted as such)
    assert analysis.unsupported_ops() == FlopCountAnalysis(model, x, backend="dispatch").unsupported_ops_warnings(False).unsupported_ops()
    assert "counted by the dispatch backend" in flop_count_table(analysis)
    with pytest.raises(JitflopsError, match=r"quantized.*backend='dispatch'"):
        FlopCountAnalysis(model, x, strict=True).total()


def test_strict_and_compute_false_raise_where_the_trace_cannot_be_taken():
    model, x = torch.compile(_mlp()), torch.randn(4, 16)
    for settings in ({"strict": True}, {"compute": False}):
        with pytest.raises(JitflopsError, match="torch.compile"):
            FlopCountAnalysis(model, x, **settings).total()


class _BoolScalars(nn.Module):
    """The sparse-attention pattern of DeepSeek-V3.2, GLM-MoE-DSA, Mistral-Large-4 and AXK2: a mask
    made by ``scatter(-1, topk, False)`` (a Python bool where the op takes a Scalar), and the other
    ops that take one."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x):
        top = x.topk(2, dim=-1).indices
        keep = torch.ones_like(x, dtype=torch.bool).scatter(-1, top, False)
        masked = self.proj(x).masked_fill(keep, False).clamp(min=False)
        filled = torch.full_like(x, True, dtype=torch.bool).index_fill(-1, top[0, 0], False)
        return torch.where(filled, masked, True) @ x.transpose(-1, -2)


def _squared(x: torch.Tensor) -> torch.Tensor:
    return torch.mm(x, x)


class _CallsAScriptedFunction(nn.Module):
    """torch's ``test_flop_counter.py::test_torchscript``: a forward calling ``torch.jit.script(foo)``."""

    def __init__(self) -> None:
        super().__init__()
        self.squared = torch.jit.script(_squared)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.squared(x)


def test_a_scripted_function_inside_the_forward_is_counted():
    """The trace keeps a scripted function as one ``prim::CallFunction`` without shapes (fvcore and
    jitflops counted it 0, the op unsupported): the dispatch backend counts the model, saying why,
    125 MACs for a 5x5 by 5x5 product, as ``FlopCounterMode``'s 250 FLOPs; strict raises, naming it."""
    model, x = _CallsAScriptedFunction(), torch.randn(5, 5)
    with FlopCounterMode(display=False) as reference:
        model(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flops = FlopCountAnalysis(model, x)
        assert flops.total() == 125 == reference.get_total_flops() // 2 and not flops.unsupported_ops()
    assert flops.counted_by == "dispatch" and "scripted function, _squared" in flops.fallback_reason
    assert sum(issubclass(w.category, JitFallbackWarning) for w in caught) == 1
    with pytest.raises(JitflopsError, match=r"scripted function, _squared \(torch.jit.script\), in the model"):
        FlopCountAnalysis(model, x, strict=True).total()


def test_bools_given_as_scalars_are_traced_by_the_jit():
    x = torch.randn(2, 5, 6)
    hand = 2 * 5 * 6 * 6 + 2 * 5 * 6 * 5  # the projection and the product
    for elementwise in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("error", JitFallbackWarning)
            jit = FlopCountAnalysis(_BoolScalars(), x, elementwise=elementwise, compute=True)
            assert jit.counted_by == "jit"
        dispatch = FlopCountAnalysis(_BoolScalars(), x, elementwise=elementwise, backend="dispatch")
        assert jit.total() == dispatch.total()
        assert jit.by_module() == dispatch.by_module()
    assert FlopCountAnalysis(_BoolScalars(), x).total() == hand


def test_a_model_that_fails_eagerly_raises_the_traces_error_and_comes_back_as_it_was():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(3, 3)).train()
    before = model_state(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TraceError, match=r"module '2' \(Linear\).*mat1 and mat2"):
            FlopCountAnalysis(model, torch.randn(2, 4)).total()
    assert not _fallback_warnings(caught)
    assert_same_state(before, model_state(model))


def test_profiles_say_which_front_end_counted():
    model, x = _quantized_mlp(), torch.randn(4, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profile = profile_model(model, x, repeats=1)
        plain = profile_model(_mlp(), x, repeats=1)
        document, plain_document = profile_to_dict(profile), profile_to_dict(plain)
        flops, macs, params = get_model_profile(model, input_shape=(4, 16), print_profile=False, as_string=False)
    assert document["summary"]["counted_by"] == "dispatch" and "quantized" in document["summary"]["fallback_reason"]
    assert plain_document["summary"]["counted_by"] == "jit" and plain_document["summary"]["fallback_reason"] is None
    assert "counted_by" in document["units"] and json.dumps(document)
    assert "counted by:" in format_model_profile(profile) and "the JIT's fallback (the model is quantized" in format_model_profile(profile)
    assert "the JIT trace" in format_model_profile(plain)
    assert params == sum(p.numel() for p in model.parameters())


class _PatchEmbedding(nn.Module):
    """PiT's and CaiT's pattern: a parameter's view (``cls_token.expand``) passed into a child module."""

    def __init__(self) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, 8))
        self.block = _TokenBlock()

    def forward(self, x):
        return self.block(x, self.cls_token.expand(x.shape[0], -1, -1))


class _TokenBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, cls_tokens):
        return self.fc(torch.cat([cls_tokens, x], dim=1))


class _NoGradView(_PatchEmbedding):
    def forward(self, x):
        with torch.no_grad():
            cls_tokens = self.cls_token.expand(x.shape[0], -1, -1)
        return self.block(x, cls_tokens)


def test_parameter_views_without_a_gradient_function_are_counted_by_dispatch():
    x = torch.randn(2, 3, 8)
    tokens = 2 * 4 * 8 * 8  # 2 images, 3 patches + the class token, an 8 x 8 projection
    for model in (_PatchEmbedding(), _NoGradView()):
        before = model_state(model)
        assert FlopCountAnalysis(model, x, backend="dispatch").by_module()["block.fc"] == tokens
        assert FlopCountAnalysis(model, x).by_module()["block.fc"] == tokens
        assert_same_state(before, model_state(model))
    # with its backward: the weight's gradient and the input's (the view made under no_grad still requires one)
    training = FlopCountAnalysis(_NoGradView(), x, backend="dispatch", backward=True)
    assert training.by_phase("block.fc") == {"forward": tokens, "backward": 2 * tokens}
    # FlopCounterMode's own module tracker asserts on this pattern, so the plain one is compared with it
    with FlopCounterMode(display=False) as torch_count:
        _PatchEmbedding()(x).sum().backward()
    assert 2 * FlopCountAnalysis(_PatchEmbedding(), x, backend="dispatch", backward=True).total() == torch_count.get_total_flops()


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class _Checkpointed(nn.Module):
    def __init__(self, reentrant) -> None:
        super().__init__()
        self.embed, self.block, self.head = nn.Linear(8, 16), _Block(), nn.Linear(16, 4)
        self.reentrant = reentrant

    def forward(self, x):
        h = self.embed(x)
        h = self.block(h) if self.reentrant is None else checkpoint(self.block, h, use_reentrant=self.reentrant)
        return self.head(h)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_recomputed_forward_is_its_own_phase(reentrant):
    x = torch.randn(4, 8)
    forward = 4 * (8 * 16 + 16 * 32 + 32 * 16 + 16 * 4)
    backward = 4 * (16 * 32 + 32 * 16) * 2 + 4 * 16 * 4 * 2 + 4 * 8 * 16  # input and weight gradients; the first layer's weight only
    # non-reentrant checkpointing stops recomputing once it has what the backward needs: the first
    # layer's output (its input is saved); the reentrant form runs the whole block again
    recompute = 4 * 16 * 32 if not reentrant else 4 * (16 * 32 + 32 * 16)
    plain = FlopCountAnalysis(_Checkpointed(None), x, backend="dispatch", backward=True).by_phase()
    assert plain == {"forward": forward, "backward": backward}
    analysis = FlopCountAnalysis(_Checkpointed(reentrant), x, backend="dispatch", backward=True)
    assert analysis.by_phase() == {"forward": forward, "backward": backward, "recompute": recompute}
    assert analysis.by_operator()["recompute.linear" if "recompute.linear" in analysis.by_operator() else "recompute.addmm"] == recompute
    with FlopCounterMode(display=False) as torch_count:
        _Checkpointed(reentrant)(x).sum().backward()
    assert 2 * analysis.total() == torch_count.get_total_flops()
    profile = profile_model(_Checkpointed(reentrant), x, repeats=1, backward=True)
    assert (profile.summary.backward_macs, profile.summary.recompute_macs) == (backward, recompute)
    assert profile_to_dict(profile)["summary"]["recompute_macs"] == recompute
    assert "recompute MACs per GPU" in format_model_profile(profile)


def test_flops_profiler_counts_a_model_the_jit_cannot_trace():
    model, x = torch.compile(_mlp()), torch.randn(4, 16)
    prof = FlopsProfiler(model)
    prof.start_profile()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(x)
        model(x)
        profile = prof.profile()
    prof.end_profile()
    assert profile.summary.macs == 2 * MLP_MACS and profile.summary.forwards == 2  # two forwards, totals as DeepSpeed's
    assert profile.summary.counted_by == "dispatch" and "torch.compile" in profile.summary.fallback_reason


def test_a_compiled_models_memory_and_training_step_are_estimated_on_the_module_it_wraps():
    """``torch.compile``'s wrapper calls the user's module from its ``forward``: the estimates' copy
    with fake tensors called the user's module with its real weights, and failed ("Please convert
    all Tensors to FakeTensors first"). The copy now calls its copy of the wrapped module, eagerly:
    the estimates are the uncompiled model's, its weights and AdamW's state by hand."""
    from jitflops import memory_footprint, predict_training_step

    model, x = _mlp(), torch.randn(4, 16)
    compiled = torch.compile(model)
    weights = (16 * 32 + 32 + 32 * 8 + 8) * 4
    estimate = memory_footprint(compiled, (x,), train="adamw")
    assert estimate.needed() == memory_footprint(model, (x,), train="adamw").needed()
    assert estimate.model.parameters == weights and estimate.model.optimizer_state == 2 * weights + 4 * 4  # two moments, and a step count a tensor
    assert predict_training_step(compiled, (x,), device="h100") == predict_training_step(model, (x,), device="h100")


def test_the_command_line_counts_a_model_the_jit_cannot_trace(tmp_path):
    (tmp_path / "compiled_factory.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))\n"
        "    return torch.compile(model)\n"
    )
    environment = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "jitflops", "compiled_factory:make", "--input-shape", "4,16", "--format", "json"], capture_output=True, text=True, timeout=300, env=environment)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)["summary"]
    assert summary["macs"] == MLP_MACS and summary["counted_by"] == "dispatch" and "torch.compile" in summary["fallback_reason"]
    assert "JitFallbackWarning" in run.stderr


def test_model_and_hardware_flops_utilisation_of_a_checkpointed_training_step():
    """MFU counts the model's FLOPs; HFU adds the forward the checkpoint ran again (PaLM's
    definitions), over the same measured time and peak."""
    model, x = _Checkpointed(True), torch.randn(4, 8)
    profiler = FlopsProfiler(model, peak_flops=1e12)
    profiler.start_profile()
    model(x).sum().backward()
    profile = profiler.profile()
    profiler.end_profile()
    summary = profile.summary
    forward = 4 * (8 * 16 + 16 * 32 + 32 * 16 + 16 * 4)
    recompute = 4 * (16 * 32 + 32 * 16)  # the reentrant checkpoint runs the whole block again
    assert summary.backward is not None and summary.recompute_macs == recompute and summary.recompute_flops == 2 * recompute
    model_flops = 2 * forward + summary.backward_flops
    assert summary.hfu / summary.mfu == pytest.approx((model_flops + 2 * recompute) / model_flops)
    text = format_model_profile(profile)
    assert "HFU = (flops + recomputed flops) / latency / peak FLOPS per GPU:" in text
    assert profile_to_dict(profile)["summary"]["hfu"] == pytest.approx(summary.hfu)
