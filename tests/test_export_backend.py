"""The export front end: an ``ExportedProgram`` or a ``.pt2`` file read statically, against hand
counts, the dispatch backend (which runs the model) and fresh counts at new sizes."""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
import zipfile

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

from jitflops import ActivationCountAnalysis, ByteCountAnalysis, FlopCountAnalysis, parameter_count
from jitflops.cli import main
from jitflops.core.errors import DataDependentTraceWarning, JitFallbackWarning, JitflopsError, OpShapeError, TraceError
from jitflops.core.model_io import ModelCall
from jitflops.examples import all_examples
from jitflops.frontends.export_trace import ProgramError, _check_drafted_sizes

transformers = pytest.importorskip("transformers")

B, S, D, H = 2, 16, 64, 4


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.out = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, H, D // H).permute(2, 0, 3, 1, 4)
        return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, D))


def _quiet(analysis):
    return analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)


def _bert() -> nn.Module:
    config = transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=100)
    torch.manual_seed(0)
    return transformers.BertModel(config).eval()


def _ids(batch: int, length: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, 100, (batch, length), generator=torch.Generator().manual_seed(0))}


def test_a_program_is_counted_by_hand_and_as_the_dispatch_backend_counts():
    model, x = Attention(), torch.randn(B, S, D)
    program = torch.export.export(model, (x,), strict=False)
    flops = FlopCountAnalysis(program, (x,))
    linear = B * S * D * 3 * D + B * S * D * D
    attention = 2 * B * H * S * S * (D // H)  # q @ k^T and the weights @ v, dense
    assert flops.total() == linear + attention
    assert flops.by_module() == FlopCountAnalysis(model, x, backend="dispatch").by_module()
    assert flops.by_operator("qkv") == {"linear": B * S * D * 3 * D}
    assert flops.counted_by == "export" and flops.backend == "export"
    assert ActivationCountAnalysis(program, (x,)).total() == ActivationCountAnalysis(model, x, backend="dispatch").total() == B * S * (3 * D + D) + B * S * D
    assert FlopCountAnalysis(model, x, backend="export").total() == flops.total()  # a model is exported first
    assert ByteCountAnalysis(program, (x,)).by_module() == ByteCountAnalysis(model, x, backend="dispatch").by_module()
    assert parameter_count(flops._model) == parameter_count(model)  # the program's modules, unflattened, with its weights


class UnusedProduct(nn.Module):
    """A layer that also updates a state its caller does not ask for: computed, its value unused
    (Qwen4-Exp's last recurrent state without a cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        x.transpose(0, 1) @ y
        return y


def test_a_program_is_counted_as_exported_and_given_back_as_it_was():
    """The product whose value nothing uses is in the program as exported, and the eager forward
    runs it; torch.export.unflatten, which names the program's modules, removes such nodes in place
    (before 2026-12-07 the count lost it, 256 MACs of 512, and the caller's program its 2 nodes)."""
    x = torch.randn(4, 8)
    program = torch.export.export(UnusedProduct(), (x,), strict=False)
    nodes = [str(node) for node in program.graph.nodes]
    flops = FlopCountAnalysis(program)
    assert flops.total() == FlopCountAnalysis(UnusedProduct(), x, backend="dispatch").total() == 4 * 8 * 8 + 8 * 4 * 8
    assert flops.by_module() == {"": 512, "linear": 256}
    assert [str(node) for node in program.graph.nodes] == nodes


def test_a_transformers_program_is_counted_as_its_model_exported():
    """Qwen3-Next, built as ``tools/sweep.py`` builds it: its gated delta rule updates a recurrent
    state after the last chunk that no output takes; its program is counted as the export backend
    counts the model, and given back as exported (before 2026-12-07 the count lost that update's products)."""
    from test_transformers_sweep import ARCHITECTURES, sweep

    config = transformers.AutoConfig.for_model("qwen3_next")
    sweep._shrink(config, sweep.RECIPES["tiny"])
    torch.manual_seed(0)
    model = getattr(transformers, ARCHITECTURES["qwen3_next"])(config).eval()
    _, inputs = sweep._first_that_runs(model, config, sweep._inputs(model, config))
    program = torch.export.export(model, (), inputs, strict=False)
    nodes = len(program.graph.nodes)
    assert _quiet(FlopCountAnalysis(program)).by_module() == _quiet(FlopCountAnalysis(model, (), inputs, backend="export")).by_module()
    assert len(program.graph.nodes) == nodes


class SelectedRows(nn.Module):
    """A layer over the rows its input's values select: a size the values decide."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x[x[:, 0] > 0])


def test_a_programs_size_its_values_decide_is_refused_by_name_and_the_model_is_counted_on_its_inputs():
    """torch.export keeps the selected rows' count as a symbol no input fixes; the count names the op,
    its module and what to do, as VITS's program (its durations decide its frames) does."""
    torch.manual_seed(0)
    model, x = SelectedRows(), torch.randn(16, 8)
    program = torch.export.export(model, (x,), strict=False)
    with pytest.raises(OpShapeError, match=r"op aten::linear in module 'linear': argument 'input' has no known shape: a size its values decide.*backend='export'"):
        FlopCountAnalysis(program).total()
    with pytest.warns(DataDependentTraceWarning, match="draft_export exported it"):
        assert FlopCountAnalysis(model, x, backend="export").total() == int((x[:, 0] > 0).sum()) * 8 * 8


def test_a_pt2_file_is_counted_at_its_sizes_at_new_ones_and_as_formulas(tmp_path):
    model = _bert()
    program = torch.export.export(model, (), _ids(2, 32), strict=False, dynamic_shapes={"input_ids": {0: Dim("batch"), 1: Dim("seq", max=512)}})
    path = tmp_path / "bert.pt2"
    torch.export.save(program, str(path))
    loaded = FlopCountAnalysis(str(path))  # no inputs: the sizes it was exported with
    assert loaded.total() == FlopCountAnalysis(model, _ids(2, 32), backend="dispatch").total()
    assert _quiet(loaded).by_module() == _quiet(FlopCountAnalysis(model, _ids(2, 32), backend="dispatch")).by_module()
    resized = FlopCountAnalysis(path, (), _ids(3, 48))
    assert resized.total() == FlopCountAnalysis(model, _ids(3, 48), backend="dispatch").total()
    formula = loaded.formula(b={"input_ids": 0}, s={"input_ids": 1})
    b, s = sympy.symbols("b s", integer=True, positive=True)
    fake = FlopCountAnalysis(model, _ids(2, 32)).formula(b=0, s=1)  # the dispatch backend on fake tensors of symbolic sizes
    assert sympy.expand(formula.total - fake.total.subs({fake.symbols["b"]: b, fake.symbols["s"]: s})) == 0
    assert formula.example == {"b": 2, "s": 32} and formula.valid_when == (s <= 512,)
    for batch, length in ((1, 7), (5, 100), (4, 512)):
        fresh = FlopCountAnalysis(model, _ids(batch, length), backend="dispatch")
        assert formula.evaluate(b=batch, s=length) == fresh.total()
        assert formula.evaluate("encoder.layer.1", b=batch, s=length) == fresh.total("encoder.layer.1")
    unnamed = loaded.formula()
    assert {symbol.name for symbol in unnamed.total.free_symbols} == {str(symbol) for symbol in program.range_constraints}
    exported_here = FlopCountAnalysis(model, _ids(2, 32), backend="export").formula(b=0, s=1)
    assert sympy.expand(exported_here.total - formula.total) == 0 and exported_here.fixed_sizes == ()


def test_files_and_inputs_a_program_cannot_take_are_named(tmp_path):
    missing, garbage, foreign = tmp_path / "none.pt2", tmp_path / "garbage.pt2", tmp_path / "foreign.pt2"
    garbage.write_bytes(b"not a zip archive")
    with zipfile.ZipFile(foreign, "w") as archive:
        archive.writestr("hello.txt", "a zip archive, but no program")
    with pytest.raises(ProgramError, match="none.pt2: no such file"):
        FlopCountAnalysis(str(missing))
    with pytest.raises(ProgramError, match="garbage.pt2: not a .pt2 archive"):
        FlopCountAnalysis(str(garbage))
    with pytest.raises(ProgramError, match="foreign.pt2: torch.export.load cannot read it as an exported program"):
        FlopCountAnalysis(str(foreign))
    model = _bert()
    program = torch.export.export(model, (), _ids(2, 32), strict=False, dynamic_shapes={"input_ids": {0: Dim("batch"), 1: Dim("seq", max=512)}})
    with pytest.raises(ProgramError, match="is 600 in the inputs given; the program was exported for 0 to 512"):
        FlopCountAnalysis(program, (), _ids(2, 600)).total()
    with pytest.raises(ProgramError, match="takes no keyword argument 'pixel_values'"):
        FlopCountAnalysis(program, (), {"pixel_values": torch.randn(1, 3)}).total()
    with pytest.raises(ValueError, match="read by backend='export'"):
        FlopCountAnalysis(program, (), _ids(2, 32), backend="dispatch")
    with pytest.raises(TypeError, match="inputs are required to analyse a BertModel"):
        FlopCountAnalysis(model)


class Branching(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), DataDependent())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * float(x.numpy().sum())  # reads the tensor's memory, which no export has


def test_an_export_that_fails_names_the_module(monkeypatch):
    model, x = Branching(), torch.ones(2, 8)
    with pytest.raises(TraceError, match=r"exporting failed in module 'body.1' \(DataDependent\)"):
        FlopCountAnalysis(model, x, backend="export").total()


class BranchOnValues(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.narrow, self.wide = nn.Linear(8, 8), nn.Linear(8, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.narrow(x) if x.sum() > 0 else self.wide(x)  # a branch on values: torch.export cannot take it


class KeepsRows(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x[x[:, 0] > 0])  # as many rows as the values keep: a size no input fixes


def test_where_values_decide_a_branch_or_a_size_draft_export_counts_these_inputs(capsys):
    """torch.export fails on a branch on values, and leaves a mask-selected size unknown;
    draft_export exports both with the inputs' values, as the JIT trace and the dispatch backend
    take them, and a warning says the count holds for these inputs, not the partial graph
    torch.export prints as the first export fails."""
    model = BranchOnValues()
    for x, macs in ((torch.ones(2, 8), 2 * 8 * 8), (-torch.ones(2, 8), 2 * 8 * 32)):
        with pytest.warns(DataDependentTraceWarning, match=r"reads tensor values in the root module .*draft_export exported it with the values of these inputs"):
            exported = FlopCountAnalysis(model, x, backend="export")
            assert exported.total() == macs == FlopCountAnalysis(model, x, backend="dispatch").total()
        assert set(+exported.by_module()) == {"", "narrow" if macs == 2 * 8 * 8 else "wide"}
    rows = torch.tensor([[1.0, 0, 0, 0], [-1, 0, 0, 0], [2, 0, 0, 0], [3, 0, 0, 0], [-5, 0, 0, 0]])
    with pytest.warns(DataDependentTraceWarning, match="makes tensors whose sizes their values decide"):
        exported = FlopCountAnalysis(KeepsRows(), rows, backend="export")
        assert exported.total() == 3 * 4 * 3 == FlopCountAnalysis(KeepsRows(), rows, backend="dispatch").total()  # 3 rows kept
    printed = capsys.readouterr().err
    assert "def forward" not in printed and "Unable to find user code" not in printed


class PatchWidths(nn.Module):
    """Qwen3-VL's vision towers' patch widths, reduced: a size values decide, floor-divided."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, grid: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        widths = torch.repeat_interleave(grid[:, 1], grid[:, 0] * grid[:, 1]) // 2
        return widths, self.fc(x)


def test_an_integer_division_of_a_value_sized_tensor_drafts():
    """torch's integer ``floor_divide`` goes through ``prims.signbit``, whose meta gives the input's
    dtype where its kernel gives bool; under draft_export that made a size no output binds, and
    the export failed (``PendingUnbackedSymbolNotFound``: the Qwen3-VL-style vision towers)."""
    model, grid, x = PatchWidths(), torch.tensor([[1, 4, 6], [2, 2, 2]]), torch.randn(5, 4)
    meta = torch.ops.prims.signbit.default.prim_meta_impl
    with pytest.warns(DataDependentTraceWarning, match="makes tensors whose sizes their values decide"):
        exported = FlopCountAnalysis(model, (grid, x), backend="export")
        assert exported.total() == 5 * 4 * 3 == FlopCountAnalysis(model, (grid, x), backend="dispatch").total()
    assert torch.ops.prims.signbit.default.prim_meta_impl is meta  # torch's, put back


class ResizedByARatio(nn.Module):
    """LLaVA-NeXT's ``select_best_resolution``, reduced: a branch on an int divided by a value."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, size: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        height, width = size.tolist()
        if 672 / width > 2:
            x = x.repeat(2, 1)
        return self.fc(x)


def test_a_branch_on_an_int_divided_by_a_value_drafts():
    """draft_export writes the branch as a runtime assert, ``IntTrueDiv(672, u1) > 2``, and torch's
    analysis that lowers it to Python operators has no integer true division: its sympy fallback
    branched on the graph's proxies, and the export failed (the LLaVA-NeXT family)."""
    from torch.utils._sympy.reference import PythonReferenceAnalysis

    torchs = vars(PythonReferenceAnalysis).get("int_truediv")
    model, x = ResizedByARatio(), torch.randn(5, 4)
    for size, rows in ((torch.tensor([300, 224]), 10), (torch.tensor([300, 448]), 5)):  # 672 / 224 = 3: repeated; 672 / 448: not
        with pytest.warns(DataDependentTraceWarning, match=r"reads tensor values in the root module \(Could not guard on data-dependent expression \(IntTrueDiv\(672"):
            exported = FlopCountAnalysis(model, (size, x), backend="export")
            assert exported.total() == rows * 4 * 3 == FlopCountAnalysis(model, (size, x), backend="dispatch").total()
    assert vars(PythonReferenceAnalysis).get("int_truediv") is torchs  # torch's, put back


class TokensByType(nn.Module):
    """Higgs Audio's decoder layer, reduced: text and audio tokens projected apart, by a mask."""

    def __init__(self) -> None:
        super().__init__()
        self.text = nn.Linear(4, 4)
        self.audio = nn.Linear(4, 4)

    def forward(self, h: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        h = h.masked_scatter(audio.unsqueeze(-1), self.audio(h[audio]))
        return h.masked_scatter(~audio.unsqueeze(-1), self.text(h[~audio]))


@pytest.mark.skipif(not hasattr(torch.fx.experimental._config, "soft_pending_unbacked_not_found_error"), reason="torch without the switch")
def test_a_mask_that_selects_every_row_drafts():
    """draft_export's check of each op's fake output against the real one turned the size of
    ``h[~audio]`` into the constant 8 inside ``index``, which then bound no symbol, and torch
    raised ``PendingUnbackedSymbolNotFound`` (Higgs Audio, Qwen3-Omni's thinker)."""
    model, h = TokensByType(), torch.randn(1, 8, 4)
    for audio_rows in (0, 3):
        audio = torch.arange(8).unsqueeze(0) < audio_rows
        with pytest.warns(DataDependentTraceWarning, match="makes tensors whose sizes their values decide"):
            exported = FlopCountAnalysis(model, (h, audio), backend="export")
            assert exported.by_module() == {"": 8 * 4 * 4, "text": (8 - audio_rows) * 16, "audio": audio_rows * 16}
            assert exported.by_module() == FlopCountAnalysis(model, (h, audio), backend="dispatch").by_module()
    assert not torch.fx.experimental._config.soft_pending_unbacked_not_found_error  # torch's, put back


class RowsByTokenType(nn.Module):
    """Qwen2-VL's ``get_rope_index``, reduced: token types counted in Python into a dictionary
    keyed by them, and a tensor made from a list of traced values."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, types: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = {0: 0, 1: 0}
        for kind in types.tolist():
            rows[kind] += 1
        extremes = torch.tensor([x.max(), x.min()])
        return self.fc(x[: rows[1]]), extremes


def test_values_a_model_keys_a_dictionary_by_are_taken_as_constants():
    """draft_export keeps each value read a symbol, which no dictionary takes as a key
    (``unhashable type: non-nested SymInt``); the draft is made again with the values taken as
    the JIT takes them, and ``torch.tensor`` of a list of traced values takes theirs."""
    from torch._subclasses.fake_impls import op_implementations_dict

    torchs = op_implementations_dict[torch.ops.aten._local_scalar_dense.default]
    model, x = RowsByTokenType(), torch.randn(5, 4)
    for types, rows in (([0, 1, 1, 0, 1], 3), ([1, 1, 1, 1, 1], 5)):
        call = (torch.tensor(types), x)
        with pytest.warns(DataDependentTraceWarning, match=r"values of these inputs \(each value its Python reads taken as a constant"):
            exported = FlopCountAnalysis(model, call, backend="export")
            assert exported.by_module() == {"": rows * 4 * 3, "fc": rows * 4 * 3} == FlopCountAnalysis(model, call, backend="dispatch").by_module()
    assert op_implementations_dict[torch.ops.aten._local_scalar_dense.default] is torchs  # torch's, put back
    assert not any(isinstance(mode, torch.overrides.TorchFunctionMode) for mode in torch.overrides._get_current_function_mode_stack())


class ReadsThenLeavesTorch(nn.Module):
    """A branch on a value (a draft), then a child that leaves torch for NumPy (no draft exports)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.child = nn.Module()
        self.child.forward = lambda x: torch.from_numpy(x.detach().numpy()) + 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            x = x * 2
        return self.child(self.fc(x))


def test_a_model_neither_draft_exports_gets_the_drafts_error_naming_the_module():
    from torch._subclasses.fake_impls import op_implementations_dict

    torchs = op_implementations_dict[torch.ops.aten._local_scalar_dense.default]
    model = ReadsThenLeavesTorch()
    with pytest.raises(TraceError, match=r"exporting failed in module 'child' \(Module\): RuntimeError: \.numpy\(\) is not supported"):
        FlopCountAnalysis(model, torch.ones(2, 4), backend="export").total()
    assert op_implementations_dict[torch.ops.aten._local_scalar_dense.default] is torchs
    assert model(torch.ones(2, 4)).shape == (2, 3)


def test_a_draft_whose_values_the_eager_forward_does_not_take_is_refused():
    """draft_export's run beside fake tensors can take other values than the eager forward
    (FastSpeech2's durations, in the transformers sweep): the program's output sizes are checked
    against one eager forward's."""
    model = KeepsRows()
    three_kept = torch.tensor([[1.0, 0, 0, 0], [2, 0, 0, 0], [3, 0, 0, 0], [-1, 0, 0, 0]])
    with _quiet_logs():
        program = torch.export.draft_export(model, (three_kept,), strict=False)
    _check_drafted_sizes(program, model, ModelCall((three_kept,)))  # the values it was drafted with
    two_kept = torch.tensor([[1.0, 0, 0, 0], [2, 0, 0, 0], [-3, 0, 0, 0], [-1, 0, 0, 0]])
    with pytest.raises(JitflopsError, match=r"draft_export took values the eager forward does not take: its outputs have sizes \[\[3, 3\]\], the forward's \[\[2, 3\]\]"):
        _check_drafted_sizes(program, model, ModelCall((two_kept,)))


@contextlib.contextmanager
def _quiet_logs():
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def test_without_a_jit_tracer_the_default_call_exports_then_dispatches(monkeypatch):
    monkeypatch.setattr("jitflops.engine.jit_analysis.jit_tracer_available", lambda: False)
    model, x = Attention(), torch.randn(B, S, D)
    with pytest.warns(JitFallbackWarning, match="has no JIT tracer; the export backend counts it instead"):
        flops = FlopCountAnalysis(model, x)
        assert flops.total() == FlopCountAnalysis(model, x, backend="dispatch").total()
    assert flops.counted_by == "export"
    branching, y = Branching(), torch.ones(2, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flops = FlopCountAnalysis(branching, y)
        assert flops.total() == 2 * 8 * 8
    assert flops.counted_by == "dispatch" and "torch.export failed" in flops.fallback_reason
    assert [str(w.message) for w in caught if issubclass(w.category, JitFallbackWarning)][-1].startswith("jitflops: torch")


SMALL_ZOO = ["convnet", "transformer", "mobilenet-v2", "resnet-50", "llama-gqa", "t5-small", "gpt2", "swin-t", "lstm", "bert-base"]


@pytest.mark.parametrize("name", SMALL_ZOO)
def test_the_zoo_is_counted_by_export_as_by_dispatch(name):
    """FLOPs per module as the dispatch backend counts them; activations as the JIT counts them (the
    dispatch backend sees an LSTM's kernels, export and the JIT the ``aten::lstm`` they run as)."""
    model, args, kwargs = all_examples()[name].instantiate("cpu")
    logging.disable(logging.WARNING)
    try:
        exported = _quiet(FlopCountAnalysis(model, args, kwargs, backend="export"))
        assert not exported.unsupported_ops()
        assert +exported.by_module() == +_quiet(FlopCountAnalysis(model, args, kwargs, backend="dispatch")).by_module()
        assert ActivationCountAnalysis(model, args, kwargs, backend="export").total() == _quiet(ActivationCountAnalysis(model, args, kwargs)).total()
    finally:
        logging.disable(logging.NOTSET)


def test_the_cli_counts_a_pt2_file(tmp_path, capsys):
    model = _bert()
    program = torch.export.export(model, (), _ids(2, 32), strict=False, dynamic_shapes={"input_ids": {0: Dim("batch"), 1: Dim("seq", max=512)}})
    path = tmp_path / "bert.pt2"
    torch.export.save(program, str(path))
    assert main([str(path), "--format", "json"]) == 0
    document = __import__("json").loads(capsys.readouterr().out)
    assert document["summary"]["counted_by"] == "export"
    assert document["summary"]["flops"] == 2 * FlopCountAnalysis(model, _ids(2, 32)).total()
    assert main([str(path), "--kwargs", '{"input_ids": "ids:4,64"}', "--depth", "1"]) == 0
    table = capsys.readouterr().out
    assert f"{FlopCountAnalysis(model, _ids(4, 64)).total() / 1e6:.3f}M" in table or f"{FlopCountAnalysis(model, _ids(4, 64)).total() / 1e9:.3f}G" in table
    assert main([str(path), "--profile"]) == 2
    assert "counted from its graph, nothing runs" in capsys.readouterr().err
    # a device to predict on: the forward's predicted time after the table, in the mode asked for
    # (until 2026-12-06 a .pt2 file's table left it out, and --mode was not passed on)
    predicted = {}
    for mode in ("eager", "graph"):
        assert main([str(path), "--device", "h100", "--mode", mode, "--depth", "1"]) == 0
        line = capsys.readouterr().out.rpartition("\n\n")[2]
        assert line.startswith(f"Predicted forward on h100-sxm ({mode}; ") and "error not yet measured on a GPU" in line
        assert main([str(path), "--device", "h100", "--mode", mode, "--format", "json"]) == 0
        predicted[mode] = __import__("json").loads(capsys.readouterr().out)["summary"]["predicted_s"]
    assert 0 < predicted["graph"] < predicted["eager"]  # CUDA graphs: the kernels without the host's time per op
    assert main([str(path), "--mode", "graph"]) == 2
    assert "--mode predicts on a device" in capsys.readouterr().err
    assert main([str(tmp_path / "none.pt2")]) == 2
    assert "none.pt2: no such file" in capsys.readouterr().err
    assert math.isfinite(document["summary"]["params"])


def test_an_unbatched_convolution_is_a_batch_of_one():
    """An export graph keeps ``conv2d`` on a ``C x H x W`` image (the JIT and dispatch see the
    batched convolution torch runs): 8 x 3 x 3 x 3 multiply-adds at each of 14 x 14 positions."""
    for module, positions in ((nn.Conv2d(3, 8, 3), 14 * 14), (nn.ConvTranspose2d(3, 8, 3), 16 * 16)):
        image = torch.randn(3, 16, 16)
        assert FlopCountAnalysis(module, image, backend="export").total() == 8 * 3 * 3 * 3 * positions == FlopCountAnalysis(module, image).total()
