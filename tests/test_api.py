"""fvcore's API semantics: module attribution, settings, copies, inputs and outputs of any shape."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from fvcore import nn as fvcore_nn
from torch import nn

import jitflops
from jitflops import FlopCountAnalysis, JitModelAnalysis

from helpers import Fn


class Shared(nn.Module):
    """One linear layer reachable as ``a`` and ``b``, called twice; one unused child."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = self.a
        self.unused = nn.Linear(4, 4)

    def forward(self, x):
        return self.b(self.a(x))


class DirectForward(nn.Module):
    """Calls a child's ``forward`` directly: its ops belong to the caller."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 8)

    def forward(self, x):
        return self.inner.forward(x)


class Recursive(nn.Module):
    def __init__(self, depth=2):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.child = Recursive(depth - 1) if depth > 1 else None

    def forward(self, x):
        x = self.fc(x)
        return self.child(x) if self.child is not None else x


class CallerVsOwner(nn.Module):
    """``helper`` is owned by ``owner`` but called from ``caller``."""

    def __init__(self):
        super().__init__()
        self.owner = nn.Module()
        self.owner.helper = nn.Linear(4, 4)
        self.caller = _Caller(self.owner.helper)

    def forward(self, x):
        return self.caller(x)


class _Caller(nn.Module):
    def __init__(self, helper):
        super().__init__()
        self.fn = [helper]  # not registered as a child

    def forward(self, x):
        return self.fn[0](x)


X = torch.randn(3, 4)


def test_shared_and_unused_modules_match_fvcore():
    ours, theirs = FlopCountAnalysis(Shared(), X), fvcore_nn.FlopCountAnalysis(Shared(), X)
    assert ours.by_module() == theirs.by_module() == {"": 96, "a": 96, "unused": 0}
    assert ours.total("b") == 96 and ours.canonical_module_name("b") == "a"
    assert ours.uncalled_modules() == theirs.uncalled_modules() == {"unused"}


def test_direct_forward_goes_to_the_caller():
    ours, theirs = FlopCountAnalysis(DirectForward(), X), fvcore_nn.FlopCountAnalysis(DirectForward(), X)
    assert ours.by_module() == theirs.by_module() == {"": 96, "inner": 0}
    assert ours.uncalled_modules() == {"inner"}


def test_recursion_and_repeated_modules():
    ours, theirs = FlopCountAnalysis(Recursive(3), X), fvcore_nn.FlopCountAnalysis(Recursive(3), X)
    assert ours.by_module() == theirs.by_module()
    assert ours.total("child") == 96 and ours.total() == 144


@pytest.mark.parametrize("mode, expected", [("owner", {"owner": 48, "owner.helper": 48, "caller": 0}), ("caller", {"owner": 0, "owner.helper": 48, "caller": 48})])
def test_ancestor_modes_match_fvcore(mode, expected):
    ours = FlopCountAnalysis(CallerVsOwner(), X).ancestor_mode(mode)
    theirs = fvcore_nn.FlopCountAnalysis(CallerVsOwner(), X).ancestor_mode(mode)
    assert {k: ours.by_module()[k] for k in expected} == expected
    assert ours.by_module() == theirs.by_module()


def test_data_parallel_wrapper():
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU())
    ours = FlopCountAnalysis(nn.DataParallel(model), X)
    theirs = fvcore_nn.FlopCountAnalysis(nn.DataParallel(model), X)
    assert ours.by_module() == theirs.by_module()
    assert ours.total("module.0") == 60


def test_set_op_handle_none_ignores_and_clear_resets():
    model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5)).eval()
    analysis = FlopCountAnalysis(model, X)
    assert analysis.by_operator() == {"linear": 60, "batch_norm": 30}
    analysis.set_op_handle("aten::batch_norm", None)
    assert analysis.by_operator() == {"linear": 60}
    analysis.set_op_handle("aten::linear", lambda inputs, outputs: 7)
    assert analysis.total() == 7
    analysis.clear_op_handles()
    assert analysis.total() == 0
    assert analysis.unsupported_ops() == {"aten::linear": 1, "aten::batch_norm": 1}


def test_set_op_handle_rejects_odd_arguments_and_non_callables():
    analysis = FlopCountAnalysis(nn.Linear(4, 4), X)
    with pytest.raises(TypeError, match="pairs"):
        analysis.set_op_handle("aten::linear")
    with pytest.raises(TypeError, match="callable"):
        analysis.set_op_handle("aten::linear", 3)


def test_copy_keeps_every_setting():
    analysis = (
        FlopCountAnalysis(CallerVsOwner(), X, elementwise=True)
        .ancestor_mode("caller")
        .set_op_handle("aten::linear", None)
        .tracer_warnings("none")
        .unsupported_ops_warnings(False)
        .uncalled_modules_warnings(False)
    )
    copied = analysis.copy(new_inputs=torch.randn(6, 4))
    assert copied._ancestor_mode == "caller" and copied._warn_trace == "none"
    assert "aten::linear" in copied._ignored_ops and copied.counts_elementwise
    assert not copied._enable_warn_unsupported_ops and not copied._enable_warn_uncalled_mods
    assert copied.total() == 0
    assert analysis.copy(new_model=nn.Sequential(nn.Linear(4, 2))).total() == 0


def test_chainable_setters_validate():
    analysis = FlopCountAnalysis(nn.Linear(4, 4), X)
    with pytest.raises(ValueError):
        analysis.tracer_warnings("some")
    with pytest.raises(ValueError):
        analysis.ancestor_mode("parent")
    with pytest.raises(KeyError, match="nope"):
        analysis.total("nope")


def test_unsupported_ops_are_warned_once_each_with_counts(jitflops_log):
    def f(x):
        return torch.linalg.qr(x).Q + torch.linalg.qr(x).R + torch.linalg.det(x)

    analysis = JitModelAnalysis(Fn(f), torch.randn(4, 4))  # no handles: every op with a cost is unsupported
    assert analysis.total() == 0
    assert analysis.unsupported_ops() == {"aten::linalg_qr": 2, "aten::linalg_det": 1}
    analysis.total()
    warned = [r.getMessage() for r in jitflops_log.records if "Unsupported" in r.getMessage()]
    assert warned == ["Unsupported operator aten::linalg_det encountered 1 time(s)", "Unsupported operator aten::linalg_qr encountered 2 time(s)"]


def test_tracer_warnings_modes():
    def f(x):
        return x * 2 if x.shape[0] > 1 else x  # shape arithmetic becomes a Python value: the tracer warns

    for mode, expect_warning in (("all", True), ("no_tracer_warning", False), ("none", False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            FlopCountAnalysis(Fn(f), torch.ones(2)).tracer_warnings(mode).total()
        assert any(issubclass(w.category, torch.jit.TracerWarning) for w in caught) == expect_warning


def test_functional_forms_and_parameter_count():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    x = torch.randn(1, 3, 8, 8)
    giga, unsupported = jitflops.flop_count(model, (x,))
    assert giga == pytest.approx(fvcore_nn.flop_count(model, (x,))[0]) and not unsupported
    mega, _ = jitflops.activation_count(model, (x,))
    assert mega == pytest.approx(fvcore_nn.activation_count(model, (x,))[0])
    assert jitflops.parameter_count(model) == fvcore_nn.parameter_count(model)


# ------------------------------------------------------------------ inputs and outputs

class KeywordModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, ids, attention_mask=None, extra=None, flag=True, scale=1.0):
        y = self.fc(ids)
        if attention_mask is not None:
            y = y + self.fc(attention_mask)
        for item in (extra or {}).get("more", []):
            y = y + self.fc(item)
        return y * scale if flag else y


@pytest.mark.parametrize(
    "inputs, kwargs, linears",
    [
        (X, None, 1),
        ((X,), {"attention_mask": X}, 2),
        ({"ids": X, "attention_mask": X}, None, 2),  # a mapping is keyword arguments
        ((X, None, {"more": [X, (X)]}), None, 3),  # nested dict of lists, None positional
        ((X,), {"extra": {"more": [X]}, "flag": False, "scale": 3.0}, 2),
    ],
)
def test_inputs_of_any_structure(inputs, kwargs, linears):
    assert FlopCountAnalysis(KeywordModel(), inputs, kwargs).total() == linears * 3 * 4 * 3


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    hidden: list
    note: str
    cache: object


class StructuredOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return {"out": Output(y, [y * 2, None], "text", object()), "none": None, "n": 3}


def test_outputs_of_any_structure():
    assert FlopCountAnalysis(StructuredOutput(), X).total() == 48


def test_hugging_face_model_without_wrapper():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=100)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 100, (1, 8))
    analysis = FlopCountAnalysis(model, (ids,), {"attention_mask": torch.ones(1, 8, dtype=torch.long)})
    linears = 8 * (4 * 32 * 32 + 2 * 32 * 64) + 32 * 32  # q, k, v, o and the MLP per token, plus the pooler
    assert analysis.by_operator()["linear"] == linears
    assert analysis.by_operator()["scaled_dot_product_attention"] == 2 * 8 * 8 * 32
    assert analysis.unsupported_ops() == {}
