"""fvcore at the import level: ``fvcore.nn.<module>`` rewritten to ``jitflops.<module>`` keeps working."""

from __future__ import annotations

import importlib

import pytest
import torch
from fvcore import nn as fvcore_nn
from torch import nn

import jitflops
from jitflops import jit_handles

FVCORE_MODULES = ["jit_handles", "jit_analysis", "flop_count", "activation_count", "print_model_statistics", "parameter_count"]
PRIVATE_NAMES_USERS_IMPORT = {
    "flop_count": ["_DEFAULT_SUPPORTED_OPS"],
    "activation_count": ["_DEFAULT_SUPPORTED_OPS"],
    "jit_analysis": ["_IGNORED_OPS", "_get_scoped_trace_graph"],
}


@pytest.mark.parametrize("module", FVCORE_MODULES)
def test_every_public_name_of_fvcore_counting_modules_exists(module):
    theirs = importlib.import_module(f"fvcore.nn.{module}")
    ours = importlib.import_module(f"jitflops.{module}")
    public = [name for name in dir(theirs) if not name.startswith("_") and getattr(getattr(theirs, name), "__module__", None) == theirs.__name__]
    assert public
    assert [name for name in public + PRIVATE_NAMES_USERS_IMPORT.get(module, []) if not hasattr(ours, name)] == []


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.norm = nn.LayerNorm(36)
        self.fc = nn.Linear(36, 5)

    def forward(self, x, y):
        h = self.norm(self.bn(self.conv(x)).flatten(2))
        h = self.fc(h)
        return torch.bmm(h, h.transpose(1, 2)), torch.einsum("abc,abd->acd", h, h), torch.matmul(h, h.transpose(1, 2)), torch.addmm(y, y, y)


def _nodes(model, inputs):
    """The op nodes of the graph fvcore counts from (weights are inputs, with complete types)."""
    aliases = {module: name for name, module in model.named_modules()}
    return {node.kind(): node for node in fvcore_nn.jit_analysis._get_scoped_trace_graph(model, inputs, aliases).nodes()}


@pytest.mark.parametrize("training", [True, False])
def test_handles_are_called_the_fvcore_way_and_agree_with_fvcore(training):
    model = Net().train(training)
    nodes = _nodes(model, (torch.randn(2, 3, 8, 8), torch.randn(4, 4)))
    pairs = [
        ("aten::_convolution", "conv_flop_jit"), ("aten::batch_norm", "batchnorm_flop_jit"), ("aten::linear", "linear_flop_jit"),
        ("aten::bmm", "bmm_flop_jit"), ("aten::einsum", "einsum_flop_jit"), ("aten::matmul", "matmul_flop_jit"),
        ("aten::addmm", "addmm_flop_jit"),
    ]
    for kind, name in pairs:
        node = nodes[kind]
        inputs, outputs = list(node.inputs()), list(node.outputs())
        ours, theirs = getattr(jit_handles, name)(inputs, outputs), getattr(fvcore_nn.jit_handles, name)(inputs, outputs)
        assert ours == theirs and ours, name
    layer_norm = nodes["aten::layer_norm"]
    for factory, arguments in (("norm_flop_counter", (2,)), ("generic_activation_jit", ("act",)), ("elementwise_flop_counter", (1, 2))):
        ours = getattr(jit_handles, factory)(*arguments)(list(layer_norm.inputs()), list(layer_norm.outputs()))
        theirs = getattr(fvcore_nn.jit_handles, factory)(*arguments)(list(layer_norm.inputs()), list(layer_norm.outputs()))
        assert ours == theirs, factory
    assert jit_handles.conv_flop_count([2, 3, 8, 8], [4, 3, 3, 3], [2, 4, 6, 6]) == fvcore_nn.jit_handles.conv_flop_count([2, 3, 8, 8], [4, 3, 3, 3], [2, 4, 6, 6]) == 2 * 4 * 27 * 36


def test_a_jit_handle_counts_right_where_fvcore_asserts():
    """fvcore's matmul handle asserts on a 1-D right operand; jitflops' counts it."""
    graph = torch.jit.trace(lambda a, b: torch.matmul(a, b), (torch.randn(5, 3), torch.randn(3))).graph
    matmul = next(n for n in graph.nodes() if n.kind() == "aten::matmul")
    assert jit_handles.matmul_flop_jit(list(matmul.inputs()), list(matmul.outputs())) == 15
    with pytest.raises((AssertionError, IndexError)):
        fvcore_nn.jit_handles.matmul_flop_jit(list(matmul.inputs()), list(matmul.outputs()))


def test_mutating_the_default_tables_changes_new_analyses(monkeypatch):
    model, x = nn.Sequential(nn.Linear(4, 6), nn.ReLU()), torch.randn(2, 4)
    flop_count, activation_count = (importlib.import_module(f"jitflops.{name}") for name in ("flop_count", "activation_count"))
    monkeypatch.setitem(flop_count._DEFAULT_SUPPORTED_OPS, "aten::linear", lambda inputs, outputs: 7)
    monkeypatch.setitem(activation_count._DEFAULT_SUPPORTED_OPS, "aten::linear", lambda inputs, outputs: 3)
    assert jitflops.FlopCountAnalysis(model, x).total() == 7
    assert jitflops.ActivationCountAnalysis(model, x).total() == 3
    monkeypatch.setattr(jitflops.jit_analysis, "_IGNORED_OPS", jitflops.jit_analysis._IGNORED_OPS - {"aten::relu"})
    assert jitflops.FlopCountAnalysis(model, x).unsupported_ops() == {"aten::relu": 1}
    monkeypatch.undo()
    assert jitflops.FlopCountAnalysis(model, x).total() == 2 * 4 * 6 and not jitflops.FlopCountAnalysis(model, x).unsupported_ops()


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4)))
        self.head = nn.Linear(4, 2)
        self.unused = nn.Linear(4, 4)

    def forward(self, x):
        return self.head(self.block(x))


def test_scoped_trace_graph_has_fvcore_scopes():
    """The same scopes, but for the root's: fvcore pushes an empty scope for the root module (every
    scope starts with "/"), which torch's trace-module map cannot."""
    model, x = Nested(), torch.randn(3, 4)
    aliases = {module: name for name, module in model.named_modules()}
    ours = jitflops.jit_analysis._get_scoped_trace_graph(model, (x,), aliases)
    theirs = fvcore_nn.jit_analysis._get_scoped_trace_graph(model, (x,), aliases)

    def scopes(graph):
        return [(node.kind(), node.scopeName().removeprefix("/")) for node in graph.nodes() if node.kind().startswith("aten::")]

    assert scopes(ours) == scopes(theirs)
    assert [scope for kind, scope in scopes(ours) if kind == "aten::linear"] == ["block/block.0", "block/block.1/block.1.0", "head"]


def test_printout_with_uncalled_modules_matches_fvcore_with_its_legend():
    model, x = Nested(), torch.randn(3, 4)
    ours = jitflops.flop_count_str(jitflops.FlopCountAnalysis(model, x))
    theirs = fvcore_nn.flop_count_str(fvcore_nn.FlopCountAnalysis(model, x))
    assert ours.startswith("N/A indicates a possibly missing statistic due to how the module was called.")
    assert ours == theirs
    table, legend = jitflops.flop_count_table(jitflops.FlopCountAnalysis(model, x)).split("\n\n")
    assert _cells(table) == _cells(fvcore_nn.flop_count_table(fvcore_nn.FlopCountAnalysis(model, x)))
    assert legend.startswith("Counting convention: 1 fused multiply-add = 1 flop")


def _cells(table: str) -> list[list[str]]:
    """A pipe table's cells without padding: fvcore's indentation of nested modules depends on the
    installed tabulate (0.10 drops it; jitflops keeps it)."""
    return [[cell.strip().rstrip(":-") for cell in row.split("|")] for row in table.splitlines()]
