"""Counts as exact formulas of batch, sequence and image sizes (torch's symbolic shapes, nothing
fitted), each evaluated at three other sizes against real counts."""

from __future__ import annotations

import logging
import warnings

import pytest
import sympy
import torch
from torch import nn

from jitflops import ActivationCountAnalysis, FlopCountAnalysis

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    logging.disable(logging.NOTSET)


def _holds_at(formula, model, make_inputs, sizes):
    for values in sizes:
        assert formula.evaluate(**values) == FlopCountAnalysis(model, make_inputs(**values)).total(), values


def test_gpt2_in_batch_and_sequence_length():
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)).eval()
    formula = FlopCountAnalysis(model, torch.randint(0, 100, (2, 8))).formula(b=0, s=1)
    b, s = sympy.symbols("b s", integer=True, positive=True)
    # attention: 2 layers x 2 heads x (16 + 16); per token: 2 layers x 12288 + 5 norms x 32 x 5 + the output layer 32 x 100
    assert sympy.expand(formula.total - (128 * b * s**2 + 28576 * b * s)) == 0
    assert formula.valid_when == () and formula.fixed_sizes == ()
    assert formula.evaluate("transformer.h.0.mlp", b=1, s=1) == 2 * 32 * 128
    _holds_at(formula, model, lambda b, s: torch.randint(0, 100, (b, s)), [dict(b=1, s=5), dict(b=3, s=17), dict(b=2, s=40)])


def test_llama_in_batch_and_sequence_length():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
    model = transformers.LlamaForCausalLM(config).eval()
    formula = FlopCountAnalysis(model, torch.randint(0, 100, (2, 8))).formula(b=0, s=1)
    _holds_at(formula, model, lambda b, s: torch.randint(0, 100, (b, s)), [dict(b=1, s=5), dict(b=3, s=17), dict(b=2, s=40)])


def test_vit_in_image_size():
    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8)
    model = transformers.ViTModel(config).eval()
    inputs = lambda b, size: {"pixel_values": torch.randn(b, 3, size, size), "interpolate_pos_encoding": True}  # noqa: E731
    formula = FlopCountAnalysis(model, inputs(2, 48)).formula(b=0, size=(2, 3))
    assert "(size//8)" in formula.formula()  # patches of 8 pixels: the floor division is exact
    _holds_at(formula, model, inputs, [dict(b=1, size=16), dict(b=3, size=40), dict(b=2, size=64)])


def test_t5_in_two_lengths():
    torch.manual_seed(0)
    config = transformers.T5Config(d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16, vocab_size=100)
    model = transformers.T5ForConditionalGeneration(config).eval()
    inputs = lambda b, s, t: {"input_ids": torch.randint(0, 100, (b, s)), "decoder_input_ids": torch.randint(0, 100, (b, t))}  # noqa: E731
    formula = FlopCountAnalysis(model, inputs(2, 8, 5)).formula(b=0, s={"input_ids": 1}, t={"decoder_input_ids": 1})
    b, s, t = (formula.symbols[name] for name in "bst")
    assert formula.total.coeff(b * s * t) == 2 * 2 * 32  # cross-attention: decoder queries over encoder keys, 2 layers x 2 heads
    _holds_at(formula, model, inputs, [dict(b=1, s=5, t=3), dict(b=3, s=17, t=9), dict(b=2, s=40, t=21)])


def test_activations_as_a_formula_too():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    formula = ActivationCountAnalysis(model, torch.randn(4, 16)).formula(b=0)
    assert formula.formula() == "40*b"


class _Branching(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.short, self.long = nn.Linear(8, 8), nn.Linear(8, 16)

    def forward(self, x):
        return self.short(x) if x.shape[1] < 10 else self.long(x)


class _Fixing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8 * 6, 4)

    def forward(self, x):
        return self.linear(x.reshape(x.shape[0], 6 * 8))  # only a sequence of 6 fits


def test_what_a_formula_cannot_follow_is_said():
    branching = FlopCountAnalysis(_Branching(), torch.randn(2, 4, 8)).formula(b=0, s=1)
    s = branching.symbols["s"]
    assert branching.formula() == "64*b*s" and any(guard.has(s) for guard in branching.valid_when)
    fixed = FlopCountAnalysis(_Fixing(), torch.randn(2, 6, 8)).formula(b=0, s=1)
    assert fixed.fixed_sizes == ("s",) and fixed.formula() == "192*b"
