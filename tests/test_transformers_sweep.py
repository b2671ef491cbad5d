"""A sample of transformers' architectures, built as ``tools/sweep.py`` builds them (tiny or
shallow configs, random weights): both backends count every one whose eager forward runs, with no
unsupported op, equal totals (and, where the default count is read from the calls, every module's
equal to the JIT trace's), and nothing below ``FlopCounterMode``'s count; decoders' mask-aware counts
equal under both backends, unpadded and left-padded; the architecture built on the meta device
counted as on the CPU, on its inputs on meta and on the CPU (unless its forward reads a value,
which no meta tensor has); and after those counts
and a training-mode dispatch count with the backward pass, every parameter and buffer is as it was.

The sample: architectures that exercised a fix (RMS norm under dispatch, einsum, string padding,
experts, custom autograd Functions, dropped results) and a fixed random draw of the others whose
eager forward ran in the last full sweep (``tools/sweep_results.json``). ``tools/sweep.py`` runs
them all.
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

_spec = importlib.util.spec_from_file_location("sweep", Path(__file__).parents[1] / "tools" / "sweep.py")
sweep = sys.modules["sweep"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep)

ARCHITECTURES = dict(sweep.architectures())
CHOSEN = ["diffllama", "led", "bloom", "yoso", "gpt2", "t5", "llama"]  # EfficientNet (70 s here) runs in tools/sweep.py
if hasattr(torch, "_grouped_mm"):  # transformers runs mixture-of-experts layers through it by default
    CHOSEN += ["mixtral", "qwen3_moe"]
RAN = {r["model_type"] for r in json.loads(sweep.RESULTS.read_text())["results"] if r["status"] == "counted"}
DRAWN = random.Random(2026).sample(sorted(RAN & set(ARCHITECTURES) - set(CHOSEN) - {"efficientnet"}), 6)


@pytest.mark.parametrize("model_type", CHOSEN + DRAWN)
def test_architecture_is_counted_cleanly(model_type):
    result = sweep.run_architecture(model_type, ARCHITECTURES[model_type])
    if not hasattr(torch, "_grouped_mm") and "_grouped_mm" in (result.error + result.jit_error + result.dispatch_error):
        pytest.skip("transformers needs torch's _grouped_mm for this architecture's experts")
    if result.status != "counted":
        pytest.skip(f"{model_type}: {result.status} ({result.error[:120]}): nothing to count")
    assert not result.jit_error and not result.dispatch_error, (result.jit_error, result.dispatch_error)
    assert not result.unsupported
    assert not result.calls_modules_differ, result.calls_modules_differ  # the default count from the calls is the trace's
    assert not result.changed, f"{len(result.changed)} parameters and buffers not given back as they were: {result.changed[:5]}"
    if not result.known_difference:
        assert result.jit == result.dispatch
        assert result.masked_agree, result.masked  # a decoder's mask-aware counts, unpadded and left-padded
        if not result.meta_reads_a_value:  # built on meta, as a model too large to hold is: its inputs on meta and on the CPU
            assert result.meta_agrees, (result.meta, result.meta_counted_by, result.jit)
    if model_type in ("bloom", "gpt2", "llama", "mixtral", "qwen3_moe"):
        assert len(result.masked) == 4 and result.masked["jit padded"] < result.masked["jit"] < result.jit
    if result.flop_counter is not None:  # None: FlopCounterMode's module tracker failed (Idefics2, SAM, qwen3_5_moe_text with transformers 5.25)
        assert 2 * result.jit >= result.flop_counter
