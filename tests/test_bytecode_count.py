"""The model's Python between its ops, counted by a recording (``jitflops.frontends.bytecode_count``)
and priced as host time: the count against CPython's own listing of a function's instructions
(``dis``) and against an eager run of the same model, the price against the spec's."""

from __future__ import annotations

import dis
import sys

import pytest
import torch
import transformers
from torch import nn

from jitflops.engine.counting import module_aliases
from jitflops.core.model_io import ModelCall
from jitflops.estimates.roofline import PredictedTimeAnalysis
from jitflops.examples import TinyTransformer, llama_config
from jitflops.frontends.bytecode_count import COUNTS_ON_THIS_PYTHON, BytecodeCounter
from jitflops.frontends.dispatch_trace import record_with_dispatch

from test_predicted_time import _spec


pytestmark = pytest.mark.skipif(not COUNTS_ON_THIS_PYTHON, reason="this Python's sys.settrace sends opcode events in part: nothing is counted")


def _straight(x: int) -> tuple[int, int]:
    a = x + 1
    b = (a, x)
    return b


INSTRUCTIONS = len([instruction for instruction in dis.get_instructions(_straight) if instruction.opname != "RESUME"])
"""What ``_straight`` runs, by CPython's listing: straight-line code, each instruction once."""


class _Glue(nn.Module):
    """An op, Python between, another op."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        for _ in range(3):
            _straight(3)
        return y + 1


def test_the_counter_counts_each_instruction_a_models_code_runs_once():
    with BytecodeCounter() as counter:
        _straight(1)  # not below a module's call: not the model's
    assert counter.count == 0
    module = _Glue()
    with BytecodeCounter() as counter:
        module(torch.ones(2))
    forward = len([instruction for instruction in dis.get_instructions(_Glue.forward) if instruction.opname != "RESUME"])
    assert 3 * INSTRUCTIONS < counter.count < 3 * INSTRUCTIONS + forward + 3 * 6  # the loop runs its body 3 times
    assert counter.take() == counter.count and counter.take() == 0


def test_a_recording_gives_each_op_the_python_run_since_the_op_before_it():
    model = _Glue()
    recording = record_with_dispatch(model, ModelCall((torch.ones(2),), {}), module_aliases(model), count_bytecode=True)
    multiply, add = (record for _, record in recording.records)
    assert (multiply.kind, add.kind) == ("aten::mul", "aten::add")
    assert multiply.bytecode < 10 and add.bytecode > 3 * INSTRUCTIONS  # the three calls of _straight ran before the add
    plain = record_with_dispatch(model, ModelCall((torch.ones(2),), {}), module_aliases(model))
    assert [record.bytecode for _, record in plain.records] == [0, 0]  # a count asks for none


@pytest.mark.parametrize("build", [lambda: TinyTransformer(),
                                   lambda: transformers.LlamaForCausalLM(llama_config(64, 2, 4, 2, 128, vocab=100))],
                         ids=["tiny-transformer", "llama"])
def test_a_meta_recording_counts_what_an_eager_run_of_the_model_runs(build):
    """The recorder's own code, its module tracker's hooks and the meta kernels' Python are not the
    model's: a prediction's count on meta equals an eager forward's on the CPU (transformers' Llama
    within 3%: it checks its device's type on the way)."""
    torch.manual_seed(0)
    model = build().eval()
    ids = torch.randint(0, 100, (1, 16))
    with torch.no_grad():
        model(ids)
        with BytecodeCounter() as counter:
            model(ids)
    analysis = PredictedTimeAnalysis(model.to("meta"), ids.to("meta"), device=_spec())
    analysis.total()
    recorded = sum(record.bytecode for _, record in analysis._trace.records)
    assert recorded == pytest.approx(counter.count, rel=0.03) and counter.count > 500


def test_a_prediction_prices_each_instruction_at_the_specs_host_time():
    model, x = _Glue(), torch.ones(2)
    without = PredictedTimeAnalysis(model, x, device=_spec()).total()
    priced = PredictedTimeAnalysis(model, x, device=_spec(host_s={**_spec().host_s, "bytecode": 1e-6}))
    total = priced.total()
    counted = sum(record.bytecode for _, record in priced._trace.records)
    assert counted > 3 * INSTRUCTIONS and total - without == pytest.approx(counted * 1e-6)


def test_a_trace_function_already_set_keeps_the_trace_and_nothing_is_counted():
    seen: list[str] = []

    def tracer(frame, event, arg):
        seen.append(event)
        return None
    sys.settrace(tracer)
    try:
        with BytecodeCounter() as counter:
            _Glue()(torch.ones(2))
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)
    assert counter.count == 0 and "call" in seen


def test_a_forward_that_raises_leaves_no_trace_function():
    class Raising(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("the model's own error")
    with pytest.raises(RuntimeError, match="own error"), BytecodeCounter():
        Raising()(torch.ones(1))
    assert sys.gettrace() is None
