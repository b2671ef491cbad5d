"""Bad input gets a clear error naming the module and op; the model always comes back unchanged."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from jitflops import ActivationCountAnalysis, FlopCountAnalysis, HandleError, ShapeFormula, TraceError, flop_count_table
from jitflops.examples import ConvNet, LSTMTagger

from helpers import assert_same_state, model_state


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.ok = nn.Linear(4, 4)
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.Linear(5, 2))  # second layer gets 4 features

    def forward(self, x):
        return self.inner(self.ok(x))


@pytest.mark.parametrize("training", [True, False])
def test_model_unchanged_after_success_in_both_modes(training):
    model = ConvNet().train(training)
    before = model_state(model)
    flop_count_table(FlopCountAnalysis(model, torch.randn(2, 3, 8, 8)), activations=ActivationCountAnalysis(model, torch.randn(2, 3, 8, 8)))
    assert_same_state(before, model_state(model))  # batch-norm running stats included


def test_wrong_input_shape_names_the_module_and_leaves_the_model_alone():
    model = Broken().train()
    before = model_state(model)
    with pytest.raises(TraceError, match=r"module 'inner\.1' \(Linear\).*mat1 and mat2 shapes cannot be multiplied") as caught:
        FlopCountAnalysis(model, torch.randn(3, 4)).total()
    assert caught.value.scope == "inner.1"
    assert_same_state(before, model_state(model))


def test_forward_that_raises_and_mutates_is_restored():
    class Mutating(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.register_buffer("steps", torch.zeros(()))
            self.scale = 1.0

        def forward(self, x):
            self.steps += 1
            self.seen = True  # a new attribute
            self.scale = torch.ones(3)  # a replaced one
            self.fc.register_forward_hook(lambda *args: None)
            self.eval()
            raise ValueError("boom")

    model = Mutating().train()
    before = model_state(model)
    with pytest.raises(TraceError, match="root module .*ValueError: boom"):
        FlopCountAnalysis(model, torch.randn(2, 4)).total()
    assert_same_state(before, model_state(model))
    assert not hasattr(model, "seen") and model.training and model.scale == 1.0


def test_handle_that_raises_names_op_and_module():
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 2)))

    def bad(inputs, outputs):
        raise ZeroDivisionError("no")

    analysis = FlopCountAnalysis(model, torch.randn(1, 4)).set_op_handle("aten::linear", bad)
    with pytest.raises(HandleError, match=r"op aten::linear in module '0' raised ZeroDivisionError: no"):
        analysis.total()


@pytest.mark.parametrize(
    "result", ["12", None, {"linear": "3"}, True, torch.tensor(3), float("nan"), float("inf"), -1, 2 + 4j, {"linear": -0.5}, {"a": float("nan")}]
)
@pytest.mark.parametrize("backend", ["jit", "dispatch"])
def test_handle_with_a_bad_result_names_op_and_module(result, backend):
    """Not a count: not a number, or NaN, infinite, negative or complex."""
    handle = ShapeFormula(lambda op: result)
    analysis = FlopCountAnalysis(nn.Sequential(nn.Linear(4, 2)), torch.randn(1, 4), backend=backend).set_op_handle("aten::linear", handle, "aten::addmm", handle)
    with pytest.raises(HandleError, match=r"op aten::(linear|addmm) in module '0' returned"):
        analysis.total()


def test_bad_kwargs_type():
    with pytest.raises(TypeError, match="kwargs must be a mapping"):
        FlopCountAnalysis(nn.Linear(4, 2), torch.randn(1, 4), kwargs=[1])


def test_lstm_model_unchanged():
    model = LSTMTagger().train()
    before = model_state(model)
    FlopCountAnalysis(model, torch.randint(0, 100, (2, 9))).total()
    assert_same_state(before, model_state(model))


@pytest.mark.parametrize("backend", ["jit", "dispatch"])
def test_random_state_is_untouched(backend):
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    x = torch.randn(2, 4)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    FlopCountAnalysis(model, x, backend=backend).total()
    assert torch.equal(torch.rand(3), expected)
