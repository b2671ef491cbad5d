"""Same numbers as fvcore on every op fvcore counts, on the model zoo and on test models."""

from __future__ import annotations

import pytest
import torch
from fvcore import nn as fvcore_nn
from torch import nn

import jitflops
from jitflops.examples import BUILTIN_EXAMPLES, ZOO

from helpers import FvcoreReady

pytest.importorskip("transformers")

ZOO_MODELS = [name for name, example in ZOO.items() if "zoo" in example.tags]


def _quiet(analysis):
    return analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)


def _strip_wrapper(counts: dict, prefix: str = "model") -> dict:
    return {("" if name == prefix else name[len(prefix) + 1:]): value for name, value in counts.items() if name == prefix or name.startswith(prefix + ".")}


@pytest.fixture(scope="module", params=ZOO_MODELS + list(BUILTIN_EXAMPLES))
def zoo_counts(request):
    example = {**ZOO, **BUILTIN_EXAMPLES}[request.param]
    model, args, kwargs = example.instantiate()
    ours = {
        "flops": _quiet(jitflops.FlopCountAnalysis(model, args, kwargs)),
        "acts": _quiet(jitflops.ActivationCountAnalysis(model, args, kwargs)),
    }
    wrapped, positional = FvcoreReady(model, list(kwargs)), tuple(kwargs.values()) or args
    theirs = {
        "flops": _quiet(fvcore_nn.FlopCountAnalysis(wrapped, positional)),
        "acts": _quiet(fvcore_nn.ActivationCountAnalysis(wrapped, positional)),
    }
    return request.param, ours, theirs


@pytest.mark.parametrize("statistic", ["flops", "acts"])
def test_every_op_fvcore_counts_has_its_value(zoo_counts, statistic):
    name, ours, theirs = zoo_counts
    our_ops, their_ops = ours[statistic].by_operator(), theirs[statistic].by_operator()
    assert their_ops, f"{name}: fvcore counted nothing"
    assert {op: our_ops.get(op) for op in their_ops} == dict(their_ops)
    assert ours[statistic].unsupported_ops() == {}


def test_per_module_equal_where_fvcore_knows_every_op(zoo_counts):
    """Module by module, our count minus the ops fvcore cannot count equals fvcore's."""
    name, ours, theirs = zoo_counts
    their_modules = _strip_wrapper(theirs["flops"].by_module_and_operator())
    for module, ops in ours["flops"].by_module_and_operator().items():
        fvcore_known = {op: count for op, count in ops.items() if op in theirs["flops"].by_operator()}
        assert fvcore_known == {op: c for op, c in their_modules[module].items() if c}, f"{name}: module {module!r}"


@pytest.mark.parametrize(
    "name, published_gflops",
    [("resnet-50", 4.11), ("vit-b16", 17.58), ("convnext-t", 4.47), ("mobilenet-v2", 0.313), ("swin-t", 4.51), ("bert-base", 11.19)],
)
def test_headline_totals(name, published_gflops, zoo_counts_by_name):
    assert zoo_counts_by_name(name).total() / 1e9 == pytest.approx(published_gflops, rel=2e-3)


@pytest.fixture(scope="module")
def zoo_counts_by_name():
    cache = {}

    def count(name):
        if name not in cache:
            model, args, kwargs = ZOO[name].instantiate()
            cache[name] = _quiet(jitflops.FlopCountAnalysis(model, args, kwargs))
        return cache[name]

    return count


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * x

    @staticmethod
    def backward(ctx, grad):
        return grad


def _fvcore_style_handle(inputs, outputs):
    from fvcore.nn.jit_handles import get_shape

    return 3 * get_shape(outputs[0])[0]


def test_fvcore_handle_and_python_op_work_unchanged():
    model = nn.Sequential(nn.Linear(4, 6))

    class WithFunction(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = model

        def forward(self, x):
            return _Square.apply(self.body(x))

    x = torch.randn(5, 4)
    handles = {"prim::PythonOp._Square": _fvcore_style_handle}
    ours = jitflops.FlopCountAnalysis(WithFunction(), x).set_op_handle(**handles)
    theirs = fvcore_nn.FlopCountAnalysis(WithFunction(), x).set_op_handle(**handles)
    assert ours.by_operator() == theirs.by_operator() == {"linear": 120, "PythonOp._Square": 15}
    assert ours.by_module() == theirs.by_module()
