"""The JIT front end: every node's module scope, from scope boundaries or from the tracer's own scopes."""

from __future__ import annotations

import sys
import threading
import warnings
from contextlib import contextmanager

import pytest
import torch
from fvcore import nn as fvcore_nn
from torch import nn

from jitflops import DataDependentTraceWarning, FlopCountAnalysis, JitFallbackWarning, JitflopsError, TraceError
from jitflops.frontends import scope_boundaries, scoped_trace
from jitflops.engine.jit_analysis import module_aliases
from jitflops.examples import BUILTIN_EXAMPLES, ZOO
from jitflops.core.model_io import ModelCall

from helpers import assert_same_state, model_state


class SharedAndRepeated(nn.Module):
    """A module called twice, one reachable by two names, and ops between child calls at each level."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.alias = self.inner[0]
        self.outer = nn.ModuleDict({"a": nn.Linear(8, 8), "b": nn.Sequential(nn.Linear(8, 8), self.inner)})

    def forward(self, x):
        x = self.inner(x) * 2
        x = self.outer["b"](x) + x
        x = self.alias(x)
        return self.outer["a"](x @ x.T @ x)


@contextmanager
def _tracer_scopes_only():
    """As if pybind11 handed out a new ``TracingState`` wrapper on every call: no scope boundaries get installed."""

    @contextmanager
    def leave_the_tracer_alone(self):
        yield

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scope_boundaries.ScopeBoundaries, "__call__", leave_the_tracer_alone)
        yield


def _ops_and_scopes(model, args, kwargs=None):
    trace = scoped_trace.trace_with_scopes(model, ModelCall(args, kwargs or {}), module_aliases(model))
    return [(kind, trace.scope_of(op)) for kind, op in trace.operations()], list(trace.scopes()), trace.graph


@pytest.mark.parametrize("name", ["shared", "t5-small", "swin-t", "transformer"])
def test_scope_boundaries_are_the_tracers_own_scopes(name):
    if name == "shared":
        model, args, kwargs = SharedAndRepeated(), (torch.randn(4, 8),), {}
    else:
        pytest.importorskip("transformers")
        model, args, kwargs = {**ZOO, **BUILTIN_EXAMPLES}[name].instantiate()
    marked_ops, marked_scopes, graph = _ops_and_scopes(model, args, kwargs)
    with _tracer_scopes_only():
        tracer_ops, tracer_scopes, _ = _ops_and_scopes(model, args, kwargs)
    assert len(marked_ops) == len(tracer_ops) > 0
    # The one known difference: the tracer puts the (free) aten::Int conversion of a traced size right
    # after the size op, where boundaries place it, while its own scope is that of the module that used it.
    differing = {(kind, other_kind) for (kind, scope), (other_kind, other_scope) in zip(marked_ops, tracer_ops) if scope != other_scope}
    assert differing <= {("aten::Int", "aten::Int")}
    assert [op for op in marked_ops if op[0] != "aten::Int"] == [op for op in tracer_ops if op[0] != "aten::Int"]
    assert set(marked_scopes) == set(tracer_scopes)
    assert not graph.findAllNodes("prim::Print")  # the sinks that kept unused values are removed


def test_scopes_of_a_shared_module_called_from_two_places():
    ops, _, _ = _ops_and_scopes(SharedAndRepeated(), (torch.randn(4, 8),))
    assert [scope for kind, scope in ops if kind == "aten::linear"] == [
        "/inner/inner.0",
        "/outer.b/outer.b.0",  # the ModuleDict is indexed, never called: not in the chain
        "/outer.b/inner/inner.0",  # the shared module keeps its canonical (first) name
        "/inner.0",  # called by its alias
        "/outer.a",
    ]
    assert {scope for kind, scope in ops if kind in ("aten::mul", "aten::add", "aten::matmul")} == {""}  # between child calls: the caller's
    by_module = FlopCountAnalysis(SharedAndRepeated(), torch.randn(4, 8)).by_module()
    assert by_module["inner.0"] == by_module["inner"] == 3 * 4 * 64  # owner mode: "inner.0" belongs to "inner"
    assert by_module["outer"] == by_module["outer.b"] + by_module["outer.a"] == 2 * 4 * 64
    assert by_module[""] == 5 * 4 * 64 + 2 * 4 * 4 * 8


def test_counts_do_not_depend_on_how_scopes_are_recorded():
    model, x = SharedAndRepeated(), torch.randn(4, 8)
    marked = FlopCountAnalysis(model, x).by_module_and_operator()
    with _tracer_scopes_only():
        assert FlopCountAnalysis(model, x).by_module_and_operator() == marked


class _Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(x)
        if h.max() > 0:  # decided by the values, right after a child module returned
            h = h * 2
        return h


def test_data_dependent_flow_in_a_submodule_is_named():
    model = nn.Sequential(nn.Linear(8, 8), _Gate())
    before = model_state(model)
    with pytest.raises(TraceError, match=r"module '1' \(_Gate\).*control flow depends on tensor values"):
        FlopCountAnalysis(model, torch.randn(2, 8), strict=True).total()
    assert_same_state(before, model_state(model))


class _StateAndShapeArithmetic(nn.Module):
    """Python values from a buffer, a parameter and shape arithmetic that passes through tensors:
    none depends on the inputs' values, so none is data-dependent."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("enabled", torch.tensor(1.0))

    def forward(self, x):
        if self.enabled.item() > 0 and self.fc.weight.abs().sum() > 0:
            x = self.fc(x)
        scale = torch.tensor(x.shape[-1]).float().sqrt().item() + x.new_ones(x.shape).sum().item()
        return self.fc(x) / scale


def _data_dependence_warnings(model, x, **settings):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        total = FlopCountAnalysis(model, x, **settings).total()
    return total, [w for w in caught if issubclass(w.category, DataDependentTraceWarning)]


def test_state_and_shape_arithmetic_are_not_data_dependent():
    total, flagged = _data_dependence_warnings(_StateAndShapeArithmetic(), torch.randn(2, 8), strict=True)
    assert total == 2 * 2 * 64 and not flagged


def test_batch_norm_without_momentum_in_training_counts_like_fvcore():
    """``momentum=None`` turns the ``num_batches_tracked`` buffer into a Python float every call."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=None)).train()
    x = torch.randn(2, 3, 8, 8)
    total, flagged = _data_dependence_warnings(model, x, strict=True)
    assert not flagged
    assert total == fvcore_nn.FlopCountAnalysis(model, x).unsupported_ops_warnings(False).total() == 2 * 4 * 36 * 27 + 5 * 2 * 4 * 36


def test_the_data_dependence_verdict_is_deterministic():
    gate = nn.Sequential(nn.Linear(8, 8), _Gate())
    verdicts = {len(_data_dependence_warnings(gate, torch.randn(2, 8))[1]) for _ in range(30)}
    verdicts_clean = {len(_data_dependence_warnings(_StateAndShapeArithmetic(), torch.randn(2, 8))[1]) for _ in range(30)}
    assert verdicts == {1} and verdicts_clean == {0}


def test_a_failure_inside_torchs_tracer_is_named_a_torch_bug_and_points_to_dispatch():
    """``aten::fill`` with a tensor value trips an internal assert of the tracer's alias analysis."""
    class Fill(nn.Module):
        def forward(self, x):
            return torch.fill(x, torch.tensor(1.0)) @ x

    x = torch.randn(3, 3)
    with pytest.raises(TraceError, match=r"failed inside torch itself \(RuntimeError: .*INTERNAL ASSERT.*torch bug.*backend='dispatch'"):
        FlopCountAnalysis(Fill(), x, strict=True).total()
    assert FlopCountAnalysis(Fill(), x, backend="dispatch").total() == 27
    with pytest.warns(JitFallbackWarning, match=r"failed inside torch itself"):
        assert FlopCountAnalysis(Fill(), x).total() == 27


def test_a_scope_boundary_the_graph_lost_is_an_error_not_a_wrong_scope():
    graph = torch.jit.trace(nn.Linear(2, 2), torch.randn(1, 2)).inlined_graph
    nodes = list(graph.nodes())
    assert scope_boundaries.read_in_trace(graph, graph.block(), [(nodes[0], "a"), (nodes[-1], None)])[nodes[-1]][1] == "/a"
    elsewhere = torch._C.Graph().param_node()
    with pytest.raises(JitflopsError, match="lost a node that marked where a module's scope opens"):
        scope_boundaries.read_in_trace(graph, graph.block(), [(nodes[0], "a"), (elsewhere, None)])


_MACHINERY_SEEN: list[list[str]] = []


class _NotesItsCallers(nn.Linear):
    """A linear layer that notes which of ``nn.Module``'s call machinery is on the stack above it."""

    def forward(self, x):
        frame, seen = sys._getframe(1), []
        while frame is not None:
            if frame.f_code.co_name in ("_wrapped_call_impl", "_call_impl", "_slow_forward"):
                seen.append(frame.f_code.co_name)
            frame = frame.f_back
        _MACHINERY_SEEN.append(seen)
        return super().forward(x)


class _DoublesItsBatch(nn.Linear):
    """A class with its own ``_call_impl``, which nn.Module's ``__call__`` runs."""

    def _call_impl(self, x):
        return super()._call_impl(torch.cat([x, x]))


class _CallPaths(nn.Module):
    """Modules called three ways: plainly, with a forward pre-hook that doubles the batch, through a
    class's own ``_call_impl``; and a hooked module called from another thread during the forward."""

    def __init__(self):
        super().__init__()
        self.plain = nn.Sequential(_NotesItsCallers(8, 8))
        self.hooked = nn.Linear(8, 8)
        self.hooked.register_forward_pre_hook(lambda module, inputs: (torch.cat([inputs[0], inputs[0]]),))
        self.custom = _DoublesItsBatch(8, 8)
        self.elsewhere = nn.Linear(8, 8)
        self.elsewhere.register_forward_hook(lambda module, inputs, output: output + 1)

    def forward(self, x):
        from_thread = []
        thread = threading.Thread(target=lambda: from_thread.append(self.elsewhere(torch.zeros(1, 8))))
        thread.start()
        thread.join()
        assert torch.equal(from_thread[0], self.elsewhere.bias.detach().unsqueeze(0) + 1)  # nn.Module's call ran the hook
        return self.custom(self.hooked(self.plain(x)))


def test_module_calls_in_the_trace_skip_nn_modules_call_machinery_and_count_the_same():
    """Inside jitflops' trace a plain module's call goes straight to ``forward`` (the tracer walks the
    stack for every node: fewer frames, a cheaper trace); hooks, a class's own ``_call_impl`` and
    calls from other threads still go through ``nn.Module``'s call. Hand counts: 4 x 8 x 8 MACs for
    the plain layer, twice that after the pre-hook, four times in the layer that doubles again."""
    model, x = _CallPaths(), torch.randn(4, 8)
    _MACHINERY_SEEN.clear()
    direct = FlopCountAnalysis(model, x).by_module()
    assert _MACHINERY_SEEN == [[]]
    assert nn.Module.__call__ is nn.Module._wrapped_call_impl
    assert {name: direct[name] for name in ("plain", "hooked", "custom", "elsewhere", "")} == {
        "plain": 256, "hooked": 512, "custom": 1024, "elsewhere": 0, "": 1792
    }
    with _tracer_scopes_only():
        assert FlopCountAnalysis(model, x).by_module() == direct
    assert len(_MACHINERY_SEEN[-1]) >= 6  # nn.Module's own call: three frames per level, two levels


def test_module_calls_are_put_back_when_the_forward_raises_or_is_interrupted():
    for error in (ValueError("the model's own error"), KeyboardInterrupt()):
        class Raises(nn.Module):
            def forward(self, x):
                raise error

        with pytest.raises((TraceError, KeyboardInterrupt)):
            FlopCountAnalysis(nn.Sequential(nn.Linear(2, 2), Raises()), torch.randn(1, 2), compute=True).total()
        assert nn.Module.__call__ is nn.Module._wrapped_call_impl


def test_a_module_call_someone_else_installed_is_left_alone(monkeypatch):
    """Where ``nn.Module.__call__`` is already replaced (another tool's wrapper), the trace keeps it:
    every module call goes through it, and it is still there after."""
    calls = []

    def wrapper(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return nn.Module._wrapped_call_impl(self, *args, **kwargs)

    model, x = SharedAndRepeated(), torch.randn(4, 8)
    expected = FlopCountAnalysis(model, x).by_module()
    monkeypatch.setattr(nn.Module, "__call__", wrapper)
    assert FlopCountAnalysis(model, x).by_module() == expected
    assert nn.Module.__call__ is wrapper and calls.count("Linear") == 5
