"""The device table, spec files, and the roofline's predicted time: by hand, on meta without memory,
and in the profile's printout, JSON and command line beside the measured time."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from torch import nn

from jitflops import format_model_profile, profile_model
from jitflops.estimates.devices import DEVICES, DeviceSpec, DeviceSpecError, device_spec, spec_of_gpu
from jitflops.estimates.error_bands import MEASURED
from jitflops.reports.files import profile_to_dict
from jitflops.examples import all_examples
from jitflops.estimates.roofline import PredictedTimeAnalysis

from helpers import command_line


def test_the_table_has_the_issues_devices_each_with_a_source():
    for name in ("h100-sxm", "h100-pcie", "h200", "b200", "a100-40gb", "a100-80gb", "l4", "l40s", "a10g", "v100", "mi300x"):
        spec = DEVICES[name]
        assert spec.source and spec.memory_bandwidth > 0 and spec.peak_flops["float32"] > 0
    h100 = device_spec("H100")
    assert h100.name == "h100-sxm" and h100.peak_for(torch.bfloat16) == 989.5e12 and h100.memory_bandwidth == 3.35e12
    assert h100.peak_for(torch.float32, tf32=True) == 494.5e12 and h100.peak_for(torch.float8_e4m3fn) == 1979e12
    assert device_spec("v100").peak_for(torch.bfloat16) == 125e12  # no bfloat16 on a V100: its float16 peak
    assert spec_of_gpu("NVIDIA A100-SXM4-40GB").name == "a100-40gb" and spec_of_gpu("NVIDIA GH200 480GB").name == "gh200"
    assert spec_of_gpu("NVIDIA L40S").name == "l40s" and spec_of_gpu("NVIDIA A10G").name == "a10g" and spec_of_gpu("GeForce GTX 1080") is None


def test_a_spec_file_round_trips(tmp_path):
    path = tmp_path / "mine.json"
    spec = DeviceSpec("mine", {"float32": 2e12, "bfloat16": 8e12}, 1e11, compute_efficiency=1.0, memory_efficiency=1.0, launch_s=2e-6,
                      compute_curve=((1e6, 0.25), (1e8, 0.75), (1e10, 1.0)), source="by hand")
    path.write_text(spec.to_json())
    assert device_spec(str(path)) == spec
    assert device_spec(json.loads(spec.to_json())) == spec


def test_a_dtype_has_its_own_compute_curve_and_a_spec_keeps_it(tmp_path):
    """A GPU's small bfloat16 products reach a smaller share of their peak than float32 ones of
    theirs: a dtype's own curve where the spec has one, else ``compute_curve``."""
    spec = DeviceSpec("curves", {"float32": 1e12, "bfloat16": 4e12}, 1e11, compute_efficiency=1.0, compute_curve=((1e6, 0.5), (1e8, 1.0)),
                      dtype_curves={"bfloat16": ((1e6, 0.1), (1e8, 1.0))})
    assert [spec.compute_share(1e6, key) for key in ("float32", "bfloat16", "float16", None)] == [0.5, 0.1, 0.5, 0.5]
    assert spec.compute_share(1e7, "bfloat16") == pytest.approx(0.55)
    assert device_spec(json.loads(spec.to_json())) == spec
    with pytest.raises(DeviceSpecError, match="dtype_curves has an unknown dtype 'fp99'"):
        DeviceSpec("bad", {"float32": 1e12}, 1e11, dtype_curves={"fp99": ((1e6, 0.5),)})


def test_float32_convolutions_take_cudnns_tf32_switch_and_products_the_matmul_one():
    """torch runs float32 convolutions on a GPU's TF32 tensor cores by default
    (``torch.backends.cudnn.allow_tf32``) and float32 products not (``torch.backends.cuda.matmul``):
    a compute-bound convolution is predicted at the TF32 peak, a Linear at the float32 one, each
    following its own switch. On an H100, ResNet-50 in float32 ran at half the float32 prediction."""
    spec = DeviceSpec("tensor cores", {"float32": 1e12, "tf32": 8e12}, 1e15, compute_efficiency=1.0, memory_efficiency=1.0, launch_s=0.0)
    conv, image = nn.Conv2d(16, 16, 3, bias=False), torch.randn(1, 16, 32, 32)
    linear, rows = nn.Linear(256, 256, bias=False), torch.randn(64, 256)
    conv_flops, linear_flops = 2 * 16 * 16 * 9 * 30 * 30, 2 * 64 * 256 * 256
    cudnn_now = {"enabled": torch.backends.cudnn.enabled, "benchmark": torch.backends.cudnn.benchmark, "deterministic": torch.backends.cudnn.deterministic}
    matmul_before = torch.backends.cuda.matmul.allow_tf32
    try:
        for cudnn, matmul in ((True, False), (False, True)):
            torch.backends.cuda.matmul.allow_tf32 = matmul
            with torch.backends.cudnn.flags(**cudnn_now, allow_tf32=cudnn):  # torch's test suite locks the plain setters
                assert PredictedTimeAnalysis(conv, image, device=spec).total() == pytest.approx(conv_flops / (8e12 if cudnn else 1e12))
                assert PredictedTimeAnalysis(linear, rows, device=spec).total() == pytest.approx(linear_flops / (8e12 if matmul else 1e12))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul_before


def test_a_calibrated_compute_curve_gives_small_products_less_of_the_peak():
    """Shares by a product's FLOPs, log-interpolated between the measured sizes, clamped at the ends."""
    spec = DeviceSpec("curve", {"float32": 1e12}, 1e11, compute_efficiency=1.0, compute_curve=((1e6, 0.25), (1e8, 0.75), (1e10, 1.0)))
    assert [spec.compute_share(flops) for flops in (1e3, 1e6, 1e7, 1e8, 1e9, 1e12)] == pytest.approx([0.25, 0.25, 0.5, 0.75, 0.875, 1.0])
    assert DeviceSpec("flat", {"float32": 1e12}, 1e11).compute_share(1e3) == 0.75  # a datasheet spec: its one efficiency
    with pytest.raises(DeviceSpecError, match="compute_curve must be"):
        DeviceSpec("bad", {"float32": 1e12}, 1e11, compute_curve=((1e6, 1.5),))


@pytest.mark.parametrize("document, message", [
    ({"name": "x", "peak_flops": {"float32": 1e12}}, "missing memory_bandwidth"),
    ({"name": "x", "peak_flops": {"float32": -1e12}, "memory_bandwidth": 1e11}, r"peak_flops\['float32'\] must be a positive FLOP/s"),
    ({"name": "x", "peak_flops": {"fp32": 1e12}, "memory_bandwidth": 1e11}, "unknown dtype 'fp32'"),
    ({"name": "x", "peak_flops": {"float32": 1e12}, "memory_bandwidth": 0}, "memory_bandwidth must be a positive"),
    ({"name": "x", "peak_flops": {"float32": 1e12}, "memory_bandwidth": 1e11, "bandwith": 1}, "unknown keys bandwith"),
])
def test_a_bad_spec_says_what_is_wrong(tmp_path, document, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(DeviceSpecError, match=message):
        device_spec(str(path))


def test_an_unknown_device_lists_the_known_names():
    with pytest.raises(DeviceSpecError, match=r"unknown device 'h10'; did you mean 'h100'\? \(known: a10, .*h100-sxm.*mi300x"):
        device_spec("h10")


def test_a_linear_predicted_by_hand_on_meta_without_memory():
    """A bf16 Linear(4096, 4096) on 8,192 tokens on an H100 SXM: compute-bound, 2·M·K·N FLOPs at
    75% of 989.5 TFLOP/s plus the kernel's fixed cost, after the host's issue of its call (a datasheet
    spec's launch time, 5 us, stands for both); built and counted on meta, no memory allocated."""
    model = nn.Linear(4096, 4096, device="meta", dtype=torch.bfloat16)
    x = torch.zeros(8192, 4096, device="meta", dtype=torch.bfloat16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as memory:
        predicted = PredictedTimeAnalysis(model, x, device="h100")
        total = predicted.total()
    flops, traffic = 2 * 8192 * 4096 * 4096, 2 * (2 * 8192 * 4096 + 4096 * 4096 + 4096)
    assert total == pytest.approx(5e-6 + max(flops / (0.75 * 989.5e12), traffic / (0.85 * 3.35e12)) + 5e-6)
    allocated = sum(event.cpu_memory_usage for event in memory.events() if event.cpu_memory_usage > 0)
    assert allocated < 2**20  # bytes: the 64 MiB input and 32 MiB weight never exist
    decode = PredictedTimeAnalysis(model, torch.zeros(1, 4096, device="meta", dtype=torch.bfloat16), device="h100")
    assert decode.total() == pytest.approx(5e-6 + 2 * (2 * 4096 + 4096 * 4096 + 4096) / (0.85 * 3.35e12) + 5e-6)  # one token: memory-bound


def test_a_profile_shows_bytes_intensity_and_the_prediction_beside_the_measured_time():
    model, args, kwargs = all_examples()["transformer"].instantiate("cpu")
    spec = DeviceSpec("this cpu", {"float32": 1e11}, 2e10, compute_efficiency=1.0, memory_efficiency=1.0, launch_s=1e-6)
    profile = profile_model(model, args, kwargs, repeats=2, device=spec)
    summary = profile.summary
    assert summary.bytes == profile.root.bytes > 0 and summary.intensity == pytest.approx(summary.flops / summary.bytes)
    expected = PredictedTimeAnalysis(model, args, kwargs, device=spec)
    assert summary.predicted_s == pytest.approx(expected.total()) and summary.predicted_to_measured == pytest.approx(summary.predicted_s * (1 + summary.timing_overhead) / summary.forward.median)
    assert profile.root.find("blocks.0.mlp").predicted_s == pytest.approx(expected.total("blocks.0.mlp"))
    text = format_model_profile(profile)
    assert re.search(r"^predicted fwd latency on this cpu \((compute|memory)-bound; ridge 5 flops/byte\): +[\d.]+ [mu]?s$", text, re.M)
    assert re.search(r"^  its error: +measured error [-+]\d+% to [-+]\d+% on a datasheet CPU", text, re.M)  # a hand-made spec: no curves
    assert re.search(r"^predicted / measured fwd latency \(without the timing hooks\): +[\d.]+$", text, re.M)
    mlp = profile.root.find("blocks.0.mlp")  # each module of the detailed tree: predicted beside measured
    bound = "compute" if mlp.intensity >= 5 else "memory"  # the spec's ridge: 1e11 FLOP/s over 2e10 B/s
    assert re.search(rf"\(mlp\): Sequential\(\n +.* predicted = {mlp.predicted_to_measured:.2f} x measured, {mlp.intensity:.3g} flops/byte \({bound}-bound\)$", text, re.M)
    document = profile_to_dict(profile)
    assert document["summary"]["prediction_device"] == "this cpu" and document["summary"]["bytes"] == summary.bytes
    assert document["modules"][0]["predicted_to_measured"] == pytest.approx(profile.root.predicted_to_measured)
    assert document["summary"]["ridge"] == pytest.approx(5.0) and {module["bound"] for module in document["modules"] if module["intensity"]} <= {"compute", "memory"}
    embedding = next(module for module in document["modules"] if module["name"] == "embed")
    assert embedding["bound"] == "memory"  # a gather: no FLOPs, only bytes


def test_a_prediction_for_another_device_is_not_compared_with_the_time_measured_here():
    """An H100's prediction over a CPU's measured time is no ratio: the printouts say where each was taken."""
    from jitflops.reports.html_report import profile_to_html

    model, args, kwargs = all_examples()["transformer"].instantiate("cpu")
    profile = profile_model(model, args, kwargs, repeats=2, device="h100")
    summary = profile.summary
    assert summary.predicted_s > 0 and summary.forward is not None and summary.measured_on == "cpu"
    assert summary.predicted_to_measured is None and all(node.predicted_to_measured is None for node in profile.root.walk())
    text = format_model_profile(profile)
    assert re.search(r"^predicted / measured fwd latency: +not compared: predicted on h100-sxm, measured on cpu$", text, re.M)
    assert "x measured" not in text
    document = profile_to_dict(profile)
    assert document["summary"]["measured_on"] == "cpu" and document["summary"]["predicted_to_measured"] is None
    page = profile_to_html(profile)
    assert "(not compared: measured on cpu)" in page and '"predicted_to_measured": 0' not in page


def test_the_command_line_predicts_on_a_named_device_and_calibrates(tmp_path):
    summary = json.loads(command_line("--example", "transformer", "--device", "a100", "--format", "json", "--quiet").stdout)["summary"]
    assert summary["prediction_device"] == "a100-80gb" and summary["device"] == "meta" and summary["predicted_s"] > 0
    assert summary["prediction_mode"] == "eager" and summary["predicted_error_band"] is None  # not measured on a GPU
    timed = command_line("--example", "transformer", "--device", "h100", "--profile", expect=2)
    assert "use --device cpu or cuda with --predict h100-sxm" in timed.stderr
    spec = tmp_path / "cpu.json"
    calibrated = subprocess.run([sys.executable, "-m", "jitflops", "calibrate", "--budget", "6", "--output", str(spec)], capture_output=True, text=True, timeout=300)
    assert calibrated.returncode == 0, calibrated.stderr
    measured = device_spec(str(spec))
    assert measured.source.endswith("in a 6 s budget")
    assert measured.peak_flops["float32"] > 1e9 and measured.memory_bandwidth > 1e9 and measured.compute_efficiency == 1.0
    shares = [share for _, share in measured.compute_curve]
    assert len(shares) >= 3 and shares == sorted(shares) and shares[-1] == 1.0 and shares[0] < 1.0  # small products reach less
    assert set(measured.native_pointwise_products) == {"float32"} and set(measured.pointwise_products) >= {"float32"}  # torch's 1 x 1 kernel and oneDNN's
    if measured.cache_bytes:  # Linux tells the cache's size: a decode step's products as a model that fits it runs them
        decode = measured.decode_products["float32"]
        assert decode.rows == (1, 4, 16) and decode.weights[0] == 256 * 256 and 2 * decode.weights[-1] * 4 <= measured.cache_bytes // 4
    table = command_line("--example", "transformer", "--device", str(spec))
    assert re.search(r"^Predicted forward on cpu \(\d+ threads\) \(eager; (compute|memory)-bound; ridge [\d.]+ flops/byte\): [\d.]+ [mu]?s; .*; measured error [-+]\d+% to [-+]\d+% on a calibrated CPU", table.stdout, re.M), table.stdout[-500:]
    assert re.search(r"^\| module +\| #parameters or shape +\| #flops +\| #activations +\| #bytes +\| #FLOP/byte +\|$", table.stdout, re.M)
    as_json = [json.loads(command_line("--example", "transformer", "--device", str(spec), "--mode", mode, "--format", "json", "--quiet").stdout)["summary"]
               for mode in ("eager", "compiled")]
    assert [summary["prediction_mode"] for summary in as_json] == ["eager", "compiled"]
    assert [tuple(summary["predicted_error_band"]) for summary in as_json] == [MEASURED["cpu"]["forward"], MEASURED["cpu"]["compiled forward"]]
    assert as_json[1]["predicted_s"] < as_json[0]["predicted_s"]  # no host time per op, the pointwise runs fused


def test_the_gpu_check_runs_its_flow_on_a_cpu(tmp_path):
    """``tools/gpu_check.py`` is for a GPU machine; its flow (calibrate, profile with predictions on
    the calibrated spec, a training step and generation, one JSON) runs here on the CPU, and without
    CUDA it refuses plainly."""
    output = tmp_path / "check.json"
    run = subprocess.run([sys.executable, "tools/gpu_check.py", "--device", "cpu", "--models", "transformer", "llama-gqa", "--dtypes", "float32",
                          "--no-tests", "--no-memory", "--repeats", "2", "--steps", "1", "--batches", "1", "--output", str(output)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    document = json.loads(output.read_text())
    row = document["models"][0]
    batch = row["batches"]["1"]
    assert row["model"] == "transformer" and row["timed_s"] > 0 and batch["eager_s"] > 0 and batch["kernel_s"] == 0  # no GPU kernels here
    assert batch["specs"]["calibrated"]["predicted_s"] > batch["specs"]["calibrated"]["kernel_predicted_s"] > 0
    assert row["modules"] and document["calibrated"]["compute_efficiency"] == 1.0 and set(document["calibrated"]["dtype_curves"]) == {"float32", "bfloat16"}
    steps = document["steps"][0]["batches"]["1"]
    assert document["steps"][0]["model"] == "llama-gqa" and steps["training_s"] > 0 and steps["decode_s"] > 0
    assert {"training_error", "prefill_error", "decode_error"} <= set(steps["specs"]["calibrated"])
    if not torch.cuda.is_available():
        refused = subprocess.run([sys.executable, "tools/gpu_check.py"], capture_output=True, text=True, timeout=300)
        assert refused.returncode == 2 and "no CUDA device here" in refused.stderr


def test_a_training_steps_backward_is_predicted_per_phase():
    """Under the dispatch backend with the backward, the prediction splits as the counts do: a
    Linear's backward (its input and weight gradients, two products of the forward's size) is
    predicted at about twice its forward on a compute-bound device spec."""
    spec = DeviceSpec("slow compute", {"float32": 1e9}, 1e15, compute_efficiency=1.0, memory_efficiency=1.0, launch_s=0.0)
    model, x = nn.Linear(256, 256), torch.randn(64, 256, requires_grad=True)
    predicted = PredictedTimeAnalysis(model, x, device=spec, backend="dispatch", backward=True).by_phase()
    forward = 2 * 64 * 256 * 256 / 1e9
    assert predicted["forward"] == pytest.approx(forward, rel=1e-3) and predicted["backward"] == pytest.approx(2 * forward, rel=1e-2)
