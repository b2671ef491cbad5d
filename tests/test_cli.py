"""The command line, end to end (its ``main``, and once ``python -m jitflops``); its JSON checked against the API's own numbers."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time

import pytest

from jitflops import FlopCountAnalysis
from jitflops.examples import BUILTIN_EXAMPLES

from helpers import command_line


def _api_counts(name: str) -> FlopCountAnalysis:
    model, args, kwargs = BUILTIN_EXAMPLES[name].instantiate()
    return FlopCountAnalysis(model, args, kwargs)


def test_default_table_on_an_example():
    run = subprocess.run([sys.executable, "-m", "jitflops", "--example", "convnet", "--quiet"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert out.startswith("| module") and "|  stem  " in out and "Counting convention:" in out
    assert "| model             | 5.514K                 | 1.68M " in out


def test_json_matches_the_api():
    document = json.loads(command_line("--example", "transformer", "--format", "json", "--quiet").stdout)
    api = _api_counts("transformer")
    modules = {m["name"]: m for m in document["modules"]}
    assert document["summary"]["macs"] == api.total()
    assert all(modules[name]["macs"] == value for name, value in api.by_module().items() if name in modules)
    assert modules["blocks.0.attention"]["macs_by_op"] == dict(api.by_operator("blocks.0.attention"))


def test_factory_with_config_inputs_and_kwargs():
    pytest.importorskip("transformers")
    document = json.loads(
        command_line(
            "transformers:BertModel", "--config", "num_hidden_layers=1", "hidden_size=32", "num_attention_heads=2",
            "intermediate_size=64", "vocab_size=100", "--input-ids", "1,8", "--kwargs", '{"attention_mask": "ones:1,8"}',
            "--format", "json", "--quiet",
        ).stdout
    )
    linears = 8 * (4 * 32 * 32 + 2 * 32 * 64) + 32 * 32
    assert document["summary"]["macs"] == linears + 2 * 8 * 8 * 32 + 5 * 8 * 32 * 3  # + attention + three layer norms
    assert document["summary"]["batch_size"] == 1


def test_torch_factory_with_input_shape_and_depth():
    out = command_line("torch.nn:Conv2d", "--config", "in_channels=3", "out_channels=8", "kernel_size=3", "--input-shape", "2,3,10,10", "--format", "csv", "--quiet").stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows[0]["module"] == "" and int(rows[0]["macs"]) == 2 * 8 * 27 * 8 * 8 and int(rows[0]["params"]) == 8 * 27 + 8


def test_profile_mode_with_trace_and_html(tmp_path):
    trace, page, report = tmp_path / "trace.json", tmp_path / "report.html", tmp_path / "profile.txt"
    command_line("--example", "convnet", "--profile", "--repeats", "3", "--trace", str(trace), "--html", str(page), "--output", str(report), "--quiet")
    text = report.read_text()
    assert "Aggregated Profile per GPU" in text and "fwd latency:" in text and "median of 3 runs" in text
    assert any(e.get("name") == "stem.0" for e in json.loads(trace.read_text())["traceEvents"])
    assert "<svg" in page.read_text()


def test_profile_json_has_latency_on_every_called_module():
    document = json.loads(command_line("--example", "lstm", "--profile", "--repeats", "2", "--peak-tflops", "2", "--format", "json", "--quiet").stdout)
    assert all(m["latency"]["iterations"] == 2 for m in document["modules"])
    summary = document["summary"]
    assert summary["forward_latency"]["median_s"] > 0 and summary["page_faults_per_forward"] >= 0
    assert summary["other_cores_while_timed"] >= 0
    # MFU against the peak given: the model's FLOP/s over 2 TFLOP/s
    assert summary["peak_flops"] == 2e12 and summary["mfu"] == pytest.approx(summary["forward_flops_per_second"] / 2e12)


def test_ops_mode_sorted_and_limited():
    out = command_line("--example", "transformer", "--ops", "--sort", "flops", "--top", "3", "--format", "csv", "--quiet").stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 3 and rows[0]["module"] == "head" and rows[0]["op"] == "aten::linear"
    assert float(rows[0]["macs"]) == 128 * 64 * 1000


def test_elementwise_option():
    counted = json.loads(command_line("--example", "convnet", "--elementwise", "--format", "json", "--quiet").stdout)
    plain = json.loads(command_line("--example", "convnet", "--format", "json", "--quiet").stdout)
    relus = 16 * 32 * 32 + 32 * 16 * 16  # the stem's and the block's ReLU, one flop per output element
    assert counted["summary"]["macs"] == plain["summary"]["macs"]  # elementwise flops are not multiply-adds
    assert counted["summary"]["flops"] - plain["summary"]["flops"] == relus
    assert {m["name"]: m["elementwise_flops_by_op"] for m in counted["modules"]}["stem.2"] == {"relu": 16 * 32 * 32}
    assert "elementwise=True counts them" not in counted["convention"]


def test_the_backward_and_the_dispatch_backend_count_a_model_on_meta(capsys):
    """``--backward`` and ``--backend dispatch`` on the meta device (nothing to time, values never
    read): the backward's multiply-adds twice the forward's (a product's two gradients), the
    dispatch forward the JIT's. They were refused on meta, the dispatch backend failing on masks."""
    from jitflops.cli import main

    def summary(*options: str) -> dict:
        assert main(["--example", "transformer", "--device", "meta", "--format", "json", "--quiet", *options]) == 0
        return json.loads(capsys.readouterr().out)["summary"]
    traced, dispatched = summary(), summary("--backend", "dispatch", "--backward")
    assert dispatched["macs"] == traced["macs"] > 0 and dispatched["backward_macs"] == 2 * traced["macs"]


def test_meta_device_counts_a_large_model():
    pytest.importorskip("transformers")
    out = command_line("transformers:LlamaModel", "--config", "hidden_size=4096", "num_hidden_layers=4", "num_attention_heads=32",
                   "num_key_value_heads=8", "intermediate_size=14336", "--input-ids", "1,1024", "--device", "meta", "--format", "json", "--quiet").stdout
    assert json.loads(out)["summary"]["params"] > 1e9


@pytest.mark.parametrize(
    "args, message",
    [
        (["nope.module:thing", "--input-ids", "1,4"], "cannot import module 'nope.module'"),
        (["torch.nn:NoSuchLayer", "--input-ids", "1,4"], "has no attribute 'NoSuchLayer'"),
        (["torch.nn:Linear", "--config", "in_features=4", "out_features=3", "--input-shape", "2,x"], "comma-separated integers"),
        (["torch.nn:Linear", "--config", "in_features=4", "out_features=3", "--input-shape", "2,5"], "module (Linear): RuntimeError: "),  # what follows is torch's wording
        (["torch.nn:Linear", "--config", "in_features=4"], "building the model failed"),
        (["--example", "convnet", "--trace", "t.json"], "--trace needs --profile"),
        (["--example", "convnet", "--profile", "--device", "meta"], "meta device has no data"),
        (["--example", "convnet", "--config", "width=8"], "the example 'convnet' has none"),
    ],
)
def test_errors_are_one_line_without_traceback(args, message):
    """In this process, as ``main`` runs for the command (``test_debug_shows_the_traceback`` runs a
    real one: 4-8 s of imports a case)."""
    stderr = command_line(*args, expect=2).stderr
    assert message in stderr
    assert "Traceback" not in stderr and stderr.strip().count("\n") == 0


def test_an_example_takes_the_inputs_given():
    """``--input-ids`` (``--input-shape``, ``--kwargs``) replace an example's own inputs: until
    2026-12-06 they were ignored, and ``--generate`` (which asks for them) predicted Llama-8B's
    generation from the example's 2,048 tokens for a prompt of 128."""
    import torch

    from jitflops.examples import TinyTransformer

    counted = json.loads(command_line("--example", "transformer", "--input-ids", "1,16", "--format", "json", "--quiet").stdout)["summary"]["macs"]
    assert counted == FlopCountAnalysis(TinyTransformer(), torch.zeros(1, 16, dtype=torch.long)).total() < _api_counts("transformer").total()
    generation = command_line("--example", "llama-gqa", "--device", "h100", "--generate", "4", "--input-ids", "1,16", "--quiet").stdout
    assert "4 new tokens from 16)" in generation
    given_by_name = command_line("--example", "llama-gqa", "--device", "h100", "--generate", "4", "--kwargs", '{"input_ids": "ids:1,16"}', "--quiet").stdout
    assert "4 new tokens from 16)" in given_by_name  # the prompt as a keyword (refused until 2026-12-06)


def test_the_large_examples_are_counted_on_meta_unless_told_otherwise():
    """``--example llama-70b`` is counted on meta (until 2026-12-06 it was built on the CPU: 275 GB of
    weights, minutes of building, then the OOM kill); on a device whose free memory its weights
    outgrow, it is refused before anything is built."""
    document = json.loads(command_line("--example", "llama-70b", "--format", "json", "--quiet").stdout)
    hidden, heads, kv_heads, ffn, layers, tokens = 8192, 64, 8, 28672, 80, 4096
    projections = 2 * hidden * hidden + 2 * hidden * hidden // heads * kv_heads + 3 * hidden * ffn  # by hand, per token
    assert document["summary"]["device"] == "meta"
    assert document["summary"]["macs"] == layers * (tokens * projections + heads * tokens * tokens * 2 * hidden // heads)
    refused = command_line("--example", "llama-70b", "--device", "cpu", expect=2).stderr
    assert "the example 'llama-70b' takes 274.86 GB of weights in float32, more than the" in refused and "free on cpu" in refused


def test_config_overrides_a_transformers_example():
    """``--config`` overrides a transformers example's configuration (until 2026-12-06 it was
    ignored): one layer of llama-gqa, counted against the API on the model built by hand."""
    import torch
    import transformers

    from jitflops.examples import llama_config

    document = json.loads(command_line("--example", "llama-gqa", "--config", "num_hidden_layers=1", "--device", "meta", "--format", "json", "--quiet").stdout)
    with torch.device("meta"):
        one_layer = transformers.LlamaModel(llama_config(256, 1, 8, 2, 688, vocab=1000))
    assert document["summary"]["params"] == sum(p.numel() for p in one_layer.parameters()) == 1000 * 256 + 256 * 256 * 2 + 256 * 64 * 2 + 3 * 256 * 688 + 3 * 256
    assert document["summary"]["macs"] == FlopCountAnalysis(one_layer, torch.zeros(1, 512, dtype=torch.long, device="meta")).total()


def test_output_paths_are_checked_before_the_analysis_runs(tmp_path):
    (tmp_path / "taken").mkdir()
    result = command_line("--example", "transformer", "--profile", "--repeats", "50", "--html", str(tmp_path / "taken"), expect=2)
    assert f"cannot write '{tmp_path / 'taken'}': it is a directory" in result.stderr
    assert "timed" not in result.stderr  # no progress bar: it failed before the timed pass


def test_debug_shows_the_traceback():  # Python's own printout of the error --debug lets through: a process of its own
    result = subprocess.run([sys.executable, "-m", "jitflops", "nope.module:thing", "--input-ids", "1,4", "--debug"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" in result.stderr


def test_console_script_is_declared():
    import importlib.metadata

    scripts = {entry.name: entry.value for entry in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts.get("jitflops") == "jitflops.cli:main"


def test_progress_bar_on_long_runs_and_quiet_turns_it_off(capsys):
    """The bar shows once a run has taken a second, whatever the machine's speed (each step here
    sleeps), and not on a short run; ``--quiet`` gives none."""
    from jitflops.cli import _progress

    def run(seconds_per_step: float) -> str:
        for _ in _progress(quiet=False)(iter(range(4)), 4, "timed"):
            time.sleep(seconds_per_step)
        return capsys.readouterr().err

    shown = run(0.4)
    assert "timed:" in shown and "it/s" in shown
    assert "timed:" not in run(0.0)
    assert _progress(quiet=True) is None
    assert "timed:" not in command_line("--example", "convnet", "--profile", "--repeats", "3", "--quiet").stderr


def test_dispatch_backend_and_backward_from_the_command_line():
    plain = json.loads(command_line("--example", "convnet", "--format", "json", "--quiet").stdout)
    dispatch = json.loads(command_line("--example", "convnet", "--backend", "dispatch", "--backward", "--format", "json", "--quiet").stdout)
    assert dispatch["summary"]["macs"] == plain["summary"]["macs"]
    assert dispatch["summary"]["backward_macs"] > plain["summary"]["macs"] and plain["summary"]["backward_macs"] is None


def test_warm_up_runs_that_many_untimed_forwards_before_the_timed_ones(monkeypatch, capsys):
    """--warm-up N adds N untimed forwards to the profile's; each of --repeats adds two (the forward
    timed with the modules' hooks, and without them)."""
    import functools

    from jitflops.cli import main
    from jitflops.examples import LSTMTagger

    calls: list[int] = []
    forward = LSTMTagger.forward
    monkeypatch.setattr(LSTMTagger, "forward", functools.wraps(forward)(lambda self, *args, **kwargs: calls.append(1) or forward(self, *args, **kwargs)))

    def forwards(warm_up: int, repeats: int) -> int:
        calls.clear()
        assert main(["--example", "lstm", "--profile", "--warm-up", str(warm_up), "--repeats", str(repeats), "--format", "json", "--quiet"]) == 0
        assert json.loads(capsys.readouterr().out)["summary"]["forward_latency"]["iterations"] == repeats
        return len(calls)

    assert forwards(4, 2) - forwards(1, 2) == 3
    assert forwards(1, 5) - forwards(1, 2) == 2 * 3
