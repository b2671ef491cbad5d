"""The dispatch backend: same numbers as the JIT on the zoo, dynamic models, measured backward FLOPs."""

from __future__ import annotations

import functools
import itertools
import warnings

import pytest
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from jitflops import DataDependentTraceWarning, FlopCountAnalysis, HandleError, JitFallbackWarning, JitflopsError, TraceError
from jitflops.examples import BUILTIN_EXAMPLES, ZOO, ConvNet, TinyTransformer

from helpers import assert_same_state, flops_of, model_state

pytest.importorskip("transformers")

ZOO_MODELS = [name for name, example in ZOO.items() if "zoo" in example.tags] + list(BUILTIN_EXAMPLES)


def _quiet(analysis):
    return analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_both_backends_give_the_same_totals_and_per_module_numbers(name):
    model, args, kwargs = {**ZOO, **BUILTIN_EXAMPLES}[name].instantiate()
    jit = _quiet(FlopCountAnalysis(model, args, kwargs))
    dispatch = _quiet(FlopCountAnalysis(model, args, kwargs, backend="dispatch"))
    assert dispatch.total() == jit.total() > 0
    assert dispatch.by_module() == jit.by_module()
    assert dispatch.unsupported_ops() == {}


class DataDependent(nn.Module):
    """Runs ``grow`` until the activations are large: how often depends on the input's values."""

    def __init__(self):
        super().__init__()
        self.grow = nn.Linear(8, 8, bias=False)
        self.head = nn.Linear(8, 2)
        with torch.no_grad():
            self.grow.weight.copy_(2 * torch.eye(8))

    def forward(self, x):
        steps = 0
        while x.abs().max() < 100:
            x = self.grow(x)
            steps += 1
        return {"logits": self.head(x), "steps": steps, "note": "a string"}


@pytest.mark.parametrize("scale, steps", [(1.0, 7), (30.0, 2)])
def test_data_dependent_control_flow_counts_what_ran(scale, steps):
    x = torch.full((3, 8), scale)
    analysis = FlopCountAnalysis(DataDependent(), x, backend="dispatch")
    assert analysis.total("grow") == steps * 3 * 8 * 8
    assert analysis.total() == steps * 3 * 64 + 3 * 8 * 2


def test_data_dependent_control_flow_under_the_jit_counts_the_path_taken_and_warns():
    """fvcore's behaviour: the traced path is counted (7 steps for these inputs), with a warning
    that names the module, the line and the dispatch backend; strict=True raises instead."""
    model = DataDependent()
    before = model_state(model)
    with pytest.warns(DataDependentTraceWarning, match=r"root module .*control flow depends on tensor values \(.*test_dispatch.py:\d+.*backend='dispatch'"):
        assert FlopCountAnalysis(model, torch.full((3, 8), 1.0)).total() == 7 * 3 * 64 + 3 * 8 * 2
    with pytest.raises(TraceError, match=r"root module .*control flow depends on tensor values \(.*test_dispatch.py:\d+.*backend='dispatch'"):
        FlopCountAnalysis(model, torch.full((3, 8), 1.0), strict=True).total()
    assert_same_state(before, model_state(model))


def test_shape_dependent_control_flow_is_fine_under_the_jit():
    class ShapeDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            if x.shape[0] > 2 and x.size(-1) == 8:
                x = self.fc(x)
            return self.fc(x).view(x.shape[0] * 2, -1)

    assert FlopCountAnalysis(ShapeDependent(), torch.randn(3, 8)).total() == 2 * 3 * 64


class ReturnsPythonValues(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return {"best": self.fc(x).argmax(-1).tolist(), "done": True}


class ReturnsNothingUseful(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        self.fc(x)
        return "done"


@pytest.mark.parametrize("backend", ["jit", "dispatch"])
def test_model_returning_no_tensor_is_counted_by_both_backends(backend):
    """What ran is counted, also when the JIT graph's outputs hold none of it."""
    x = torch.randn(5, 8)
    assert FlopCountAnalysis(ReturnsNothingUseful(), x, backend=backend).total() == 5 * 8 * 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataDependentTraceWarning)  # .tolist() turns data into Python values
        assert FlopCountAnalysis(ReturnsPythonValues(), x, backend=backend).total() == 5 * 8 * 4


def test_unused_results_are_counted_by_both_backends():
    class DropsALayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.dropped = nn.Linear(8, 4), nn.Linear(8, 16)

        def forward(self, x):
            self.dropped(x).relu()
            return self.used(x)

    x = torch.randn(5, 8)
    expected = {"": 5 * 8 * 20, "used": 5 * 8 * 4, "dropped": 5 * 8 * 16}
    for backend in ("jit", "dispatch"):
        assert FlopCountAnalysis(DropsALayer(), x, backend=backend).by_module() == expected


def test_compiled_model():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    compiled = torch.compile(model)
    x = torch.randn(2, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # whatever torch's version says about compiling with global hooks
        assert FlopCountAnalysis(compiled, x, backend="dispatch").total() == 2 * (8 * 16 + 16 * 4)
        with pytest.warns(JitFallbackWarning, match="torch.compile"):
            default = FlopCountAnalysis(compiled, x)
            assert default.total() == 2 * (8 * 16 + 16 * 4) and default.counted_by == "dispatch"
    with pytest.raises(JitflopsError, match=r"torch.compile.*backend='dispatch'"):
        FlopCountAnalysis(compiled, x, strict=True).total()


def test_backward_is_measured_and_attributed_to_modules():
    model = ConvNet().train()
    x = torch.randn(2, 3, 16, 16)
    before = model_state(model)
    analysis = FlopCountAnalysis(model, x, backend="dispatch", backward=True)
    forward, backward = analysis.by_phase()["forward"], analysis.by_phase()["backward"]
    conv0, conv1 = 2 * 16 * 27 * 16 * 16, 2 * 32 * 16 * 9 * 8 * 8
    ops = analysis.by_operator()
    assert ops["conv"] == conv0 + conv1
    assert ops["backward.conv"] == conv0 + 2 * conv1  # the first conv needs no input gradient
    assert analysis.by_phase("head") == {"forward": 2 * 32 * 10, "backward": 2 * 2 * 32 * 10}  # input and weight gradients
    assert analysis.by_operator("block.0") == {"conv": conv1, "backward.conv": 2 * conv1}
    assert 1.5 < backward / forward < 2.0
    assert_same_state(before, model_state(model))
    assert all(p.grad is None for p in model.parameters())


def test_backward_with_a_custom_loss_and_an_existing_gradient():
    model = nn.Linear(4, 3)
    model.weight.grad = torch.ones(3, 4)
    x = torch.randn(5, 4, requires_grad=True)
    analysis = FlopCountAnalysis(model, x, backend="dispatch", backward=lambda out: out.pow(2).mean().backward())
    assert analysis.by_phase() == {"forward": 60, "backward": 120}  # input and weight gradients
    assert torch.equal(model.weight.grad, torch.ones(3, 4)) and x.grad is None


def test_backward_needs_the_dispatch_backend():
    with pytest.raises(ValueError, match="backend='dispatch'"):
        FlopCountAnalysis(nn.Linear(2, 2), torch.randn(1, 2), backward=True)
    with pytest.raises(ValueError, match="backend must be one of"):
        FlopCountAnalysis(nn.Linear(2, 2), torch.randn(1, 2), backend="fx")


def test_fvcore_style_handle_is_refused_clearly_on_dispatch():
    analysis = FlopCountAnalysis(nn.Linear(4, 2), torch.randn(1, 4), backend="dispatch").set_op_handle("aten::addmm", lambda i, o: 1)
    with pytest.raises(HandleError, match="fvcore-style handle"):
        analysis.total()


def test_dispatch_errors_name_the_module_and_restore_the_model():
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(5, 2))).train()
    before = model_state(model)
    with pytest.raises(TraceError, match=r"module '1\.0' \(Linear\)"):
        FlopCountAnalysis(model, torch.randn(3, 4), backend="dispatch").total()
    assert_same_state(before, model_state(model))


def test_copy_keeps_the_backend():
    analysis = FlopCountAnalysis(TinyTransformer(), torch.randint(0, 1000, (1, 8)), backend="dispatch", backward=True)
    copied = analysis.copy(new_inputs=torch.randint(0, 1000, (1, 16)))
    assert copied.backend == "dispatch" and copied.by_phase()["backward"] > 0


def test_training_mode_transformer_backward_has_no_unknown_op():
    import transformers

    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100)
    model = transformers.BertModel(config).train()  # attention dropout: the math kernel, with its own softmax
    ids = torch.randint(0, 100, (2, 8))
    analysis = FlopCountAnalysis(model, ids, backend="dispatch", backward=True)
    phases = analysis.by_phase()
    assert analysis.unsupported_ops() == {}
    assert phases["forward"] == FlopCountAnalysis(model.eval(), ids).total()
    assert phases["backward"] == 2 * phases["forward"]  # every product, norm and attention needs both gradients


class _GramTwice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.mm(x, x.t()) * 2

    @staticmethod
    def backward(ctx, grad):
        return grad


def test_custom_autograd_function_counts_what_its_forward_runs():
    """Both backends count the ``mm`` inside; a handle set for the Function replaces its parts (fvcore's way)."""
    class WithFunction(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return _GramTwice.apply(self.fc(x))

    x = torch.randn(3, 4)
    for backend in ("jit", "dispatch"):
        analysis = FlopCountAnalysis(WithFunction(), x, backend=backend)
        assert analysis.total() == 3 * 4 * 4 + 3 * 4 * 3 and not analysis.unsupported_ops()
    with_handle = FlopCountAnalysis(WithFunction(), x).set_op_handle("prim::PythonOp._GramTwice", lambda inputs, outputs: 5)
    assert with_handle.by_operator() == {"linear": 48, "PythonOp._GramTwice": 5}


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "conv_transpose"])
def test_a_grouped_convolutions_backward_is_the_sum_of_its_groups(transposed):
    """FlopCounterMode charges a grouped convolution's weight gradient as if ungrouped (groups times
    the work); torch's own count of each group run as a convolution of its own is the reference."""
    groups, x = 4, torch.randn(2, 8, 10, 10, requires_grad=True)
    conv = (nn.ConvTranspose2d if transposed else nn.Conv2d)(8, 12 if not transposed else 8, 3, groups=groups, stride=2, bias=False)
    analysis = FlopCountAnalysis(conv, x, backend="dispatch", backward=True)
    per_group = 0
    for part, weight in zip(x.detach().chunk(groups, dim=1), conv.weight.detach().chunk(groups, dim=0)):
        part.requires_grad_(True)
        weight.requires_grad_(True)
        run = F.conv_transpose2d if transposed else F.conv2d
        with FlopCounterMode(display=False) as torch_count:
            run(part, weight, stride=2).sum().backward()
        per_group += torch_count.get_total_flops() // 2
    assert analysis.total() == per_group
    with FlopCounterMode(display=False) as grouped_count:
        conv(x).sum().backward()
    assert grouped_count.get_total_flops() // 2 > per_group  # torch's overcount of the weight gradient


@pytest.mark.parametrize("shapes", [((1, 1, 1), (2, 1, 2)), ((2, 2), (2, 2)), ((2, 3, 4), (4, 3, 2))], ids=str)
def test_tensordot_is_counted_alike_by_both_backends_over_every_dims(shapes):
    """Every pairing of contracted dims torch accepts, size-1 dims summed out and full contractions
    (a ``dot`` in order, ``mul`` and ``sum`` out of order) included: the JIT's formula against what
    the dispatch backend sees torch run."""
    a, b = torch.randn(shapes[0]), torch.randn(shapes[1])
    compared = 0
    for k in range(min(a.dim(), b.dim()) + 1):
        for dims in itertools.product(itertools.permutations(range(a.dim()), k), itertools.permutations(range(b.dim()), k)):
            dims = tuple(map(list, dims))
            try:
                torch.tensordot(a, b, dims=dims)
            except RuntimeError:  # sizes that do not contract
                continue
            contraction = functools.partial(torch.tensordot, dims=dims)
            assert flops_of(contraction, a, b).total() == flops_of(contraction, a, b, backend="dispatch").total(), dims
            compared += 1
    assert compared >= 5
