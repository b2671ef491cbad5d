"""A command line without traps: each trap a new user met, as a test."""

from __future__ import annotations

import importlib.metadata
import inspect
import re

import pytest
import torch
from torch import nn

from jitflops import FlopCountAnalysis, format_model_profile, profile_model
from jitflops.cli import main
from jitflops.examples import ConvNet, TinyTransformer
from jitflops.engine.jit_analysis import module_aliases
from jitflops.core.model_io import ModelCall
from jitflops.profiling.op_table import op_table
from jitflops.timing.timed_pass import LatencyStats


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_an_unknown_config_key_is_an_error_that_suggests_the_right_one(capsys):
    pytest.importorskip("transformers")
    code, out, err = run(capsys, "transformers:BertModel", "--config", "num_hidden_layrs=2", "--input-ids", "1,8", "--quiet")
    assert code == 2 and out == ""
    assert err.strip() == "jitflops: error: --config: BertConfig has no setting 'num_hidden_layrs'; did you mean 'num_hidden_layers'?"


def test_token_ids_stay_inside_the_models_smallest_embedding(capsys):
    code, out, err = run(capsys, "torch.nn:Embedding", "--config", "num_embeddings=100", "embedding_dim=8", "--input-ids", "4,200", "--quiet")
    assert code == 0 and err == "" and re.search(r"^\| model +\| 0.8K ", out, re.M)


def test_the_per_op_table_warms_up_repeats_and_takes_medians():
    model = TinyTransformer().eval()
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    call = ModelCall((torch.randint(0, 1000, (2, 16)),))
    analysis = FlopCountAnalysis(model, call.args)
    counts = analysis.op_counts()
    calls.clear()
    rows = op_table(model, call, module_aliases(model), counts, warm_up=2, repeats=3)
    assert len(calls) == 5 and all(row.time_s >= 0 for row in rows)
    assert sum(row.macs or 0 for row in rows) == analysis.total()


@pytest.mark.parametrize("argv, problem", [
    (("--sort", "flops"), "--sort orders the rows of --ops and of --format csv"),
    (("--top", "3"), "--top limits --ops rows"),
    (("--ops", "--format", "tree"), "--format tree shows the module tree"),
    (("--shapes", "--format", "json"), "--shapes adds a column"),
])
def test_options_that_would_do_nothing_are_rejected(capsys, argv, problem):
    code, out, err = run(capsys, "--example", "convnet", "--quiet", *argv)
    assert code == 2 and out == "" and problem in err


def test_sort_and_top_work_where_they_apply(capsys):
    code, out, _ = run(capsys, "--example", "convnet", "--quiet", "--format", "csv", "--sort", "flops", "--top", "3")
    rows = out.strip().splitlines()[1:]
    assert code == 0 and len(rows) == 3 and rows[0].startswith(",ConvNet")  # the root has the most FLOPs


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and re.fullmatch(r"jitflops \d+\.\d+\.\d+ \(torch [^)]+\)\n", capsys.readouterr().out)


def test_a_one_line_error_keeps_its_reason(capsys):
    pytest.importorskip("transformers")
    code, _, err = run(capsys, "transformers:BertModel", "--config", 'num_hidden_layers="two"', "--input-ids", "1,8", "--quiet")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "Validation error for field 'num_hidden_layers':" in err and "expected int, got str" in err


def test_convolutions_on_the_meta_device_count_as_on_the_cpu(capsys):
    _, on_cpu, _ = run(capsys, "--example", "convnet", "--quiet")
    code, on_meta, err = run(capsys, "--example", "convnet", "--device", "meta", "--quiet")
    assert code == 0 and err == "" and on_meta == on_cpu


def test_the_module_table_follows_execution_order(capsys):
    _, out, _ = run(capsys, "--example", "convnet", "--quiet", "--depth", "1")
    assert [line.split("|")[1].strip() for line in out.splitlines()[2:7]] == ["model", "stem", "block", "pool", "head"]


def test_an_empty_model_shows_zero_parameters_and_no_meaningless_overhead(capsys):
    code, out, _ = run(capsys, "torch.nn:Identity", "--input-shape", "2,3", "--quiet")
    assert code == 0 and re.search(r"^\| model +\| 0 +\| 0 ", out, re.M)
    code, out, _ = run(capsys, "torch.nn:Identity", "--input-shape", "2,3", "--quiet", "--profile", "--repeats", "3")
    assert code == 0 and re.search(r"^timing overhead \(fwd with hooks / without - 1\): +n/a \(the forward takes under 0.1 ms", out, re.M)


def test_noisy_timings_are_flagged_with_the_number_of_runs():
    profile = profile_model(nn.Linear(4, 4), torch.randn(2, 4), repeats=2)
    noisy = LatencyStats((1e-3, 1e-3, 1e-3, 9e-3, 9e-3, 9e-3))
    text = format_model_profile(profile.__class__(**{**profile.__dict__, "summary": profile.summary.__class__(**{**profile.summary.__dict__, "forward": noisy})}))
    assert re.search(r"^fwd latency runs: +median of 6 runs, IQR 8 ms$", text, re.M)
    assert "warning: the fwd latency's spread (IQR) is larger than its median" in text
    quiet = format_model_profile(profile)
    assert "median of 2 runs" in quiet and "warning:" not in quiet


def test_help_shows_every_front_end_setting_and_the_package_has_metadata():
    parameters = inspect.signature(FlopCountAnalysis).parameters
    assert {"backend", "backward", "strict", "compute", "elementwise"} <= set(parameters)
    metadata = importlib.metadata.metadata("jitflops")
    assert metadata["Author"] and (metadata["Home-page"] or metadata.get_all("Project-URL"))


def test_output_shapes_match_the_tensors_modules_return(capsys):
    model = ConvNet().eval()
    returned = {}
    for name, module in model.named_modules():
        module.register_forward_hook(lambda module, args, output, name=name: returned.setdefault(name, list(output.shape)) and None)
    model(torch.randn(1, 3, 32, 32))  # the example's own input
    code, out, _ = run(capsys, "--example", "convnet", "--quiet", "--shapes")
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in out.splitlines()[2:] if line.startswith("|")]
    shown = {row[0]: row[4] for row in rows if row[4]}
    assert code == 0 and shown.pop("model") == str(returned[""])
    assert set(shown) >= {"stem", "stem.0", "block", "pool", "head"}
    for name, text in shown.items():
        assert text == str(returned[name])
