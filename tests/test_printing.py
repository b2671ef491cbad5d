"""fvcore's printouts, with the indentation tabulate 0.10 costs fvcore, and without side effects."""

from __future__ import annotations

import torch
from fvcore import nn as fvcore_nn
from torch import nn

from jitflops import ActivationCountAnalysis, FlopCountAnalysis, flop_count_str, flop_count_table, parameter_count_table
from jitflops.examples import ConvNet


def _cells(table: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("|") and not line.startswith("|:")]


def _indents(table: str) -> list[int]:
    rows = [line.strip("|").split("|")[0] for line in table.splitlines()[2:] if line.startswith("|")]
    return [len(cell) - len(cell.lstrip()) - 1 for cell in rows]


X = torch.randn(2, 3, 16, 16)


def test_table_has_fvcore_cells_and_keeps_indentation():
    model = ConvNet()
    ours = flop_count_table(FlopCountAnalysis(model, X), activations=ActivationCountAnalysis(model, X), show_convention=False)
    theirs = fvcore_nn.flop_count_table(fvcore_nn.FlopCountAnalysis(model, X), activations=fvcore_nn.ActivationCountAnalysis(model, X))
    assert _cells(ours) == _cells(theirs)
    assert _indents(ours)[:6] == [0, 1, 2, 3, 3, 2]  # model, stem, stem.0, stem.0.weight, stem.0.bias, stem.1
    assert "|  stem  " in ours and "|    stem.0.weight" in ours


def test_table_depth_shapes_and_convention_line():
    model = ConvNet()
    analysis = FlopCountAnalysis(model, X)
    shallow = flop_count_table(analysis, max_depth=1, show_param_shapes=False)
    assert [row[0] for row in _cells(shallow)[1:]] == ["model", "stem", "block", "head", "pool"]
    assert "weight" not in shallow
    assert shallow.endswith("Counting convention: " + analysis.convention())


def test_str_matches_fvcore():
    model = ConvNet()
    ours = flop_count_str(FlopCountAnalysis(model, X), activations=ActivationCountAnalysis(model, X))
    theirs = fvcore_nn.flop_count_str(fvcore_nn.FlopCountAnalysis(model, X), activations=fvcore_nn.ActivationCountAnalysis(model, X))
    assert ours == theirs
    assert "#params: 0.45K, #flops: 0.22M, #acts: 8.19K" in ours  # stem.0: 16*27 + 16 params; 2 images x 16x16 positions x 16 x 27 flops


def test_uncalled_module_shows_not_available():
    class WithUnused(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.used(x)

    text = flop_count_str(FlopCountAnalysis(WithUnused(), torch.randn(1, 4)))
    assert "#params: 20, #flops: N/A" in text


def test_printers_do_not_change_the_analysis_settings():
    analysis = FlopCountAnalysis(ConvNet(), X)
    flop_count_table(analysis)
    flop_count_str(analysis)
    assert analysis._enable_warn_unsupported_ops and analysis._enable_warn_uncalled_mods
    assert analysis._warn_trace == "no_tracer_warning"


def test_parameter_count_table_matches_fvcore_cells():
    model = ConvNet()
    ours, theirs = parameter_count_table(model, max_depth=2), fvcore_nn.parameter_count_table(model, max_depth=2)
    assert _cells(ours) == _cells(theirs)
    assert "|  stem  " in ours
