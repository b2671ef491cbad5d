"""What only a GPU shows: the counts of the kernels CUDA runs (SDPA's flash, memory-efficient and
cuDNN attention and their backwards, cuDNN's convolutions) equal the CPU's, and FlopCounterMode's
count of those attention kernels; the command line profiles on CUDA. Skipped without CUDA (CI has
none): ``tools/gpu_check.py`` runs them on a lent GPU."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_leaves, tree_map_only
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils.flop_counter import FlopCounterMode

from jitflops import FlopCountAnalysis, memory_footprint
from jitflops.examples import all_examples

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

ZOO = ["bert-base", "gpt2", "llama-gqa", "t5-small", "resnet-50"]
ATTENTION = ["bert-base", "gpt2", "llama-gqa"]
DTYPES = [torch.float32, torch.bfloat16]


def _example(name: str, device: str, dtype: torch.dtype) -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    model, args, kwargs = all_examples()[name].instantiate("cpu")

    def cast(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(device=device, dtype=dtype) if tensor.is_floating_point() else tensor.to(device)

    return model.to(device=device, dtype=dtype), tree_map_only(torch.Tensor, cast, args), tree_map_only(torch.Tensor, cast, kwargs)


def _analysis(name: str, device: str, dtype: torch.dtype, training: bool = False, **settings: Any) -> FlopCountAnalysis:
    model, args, kwargs = _example(name, device, dtype)
    return FlopCountAnalysis(model.train(training), args, kwargs, **settings).unsupported_ops_warnings(False).uncalled_modules_warnings(False)


@pytest.mark.parametrize("backend", ["jit", "dispatch", "export"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ZOO)
def test_cuda_counts_equal_the_cpus_per_module(name, dtype, backend):
    """The same model on the GPU, in float32 and bfloat16 (where SDPA takes its flash or cuDNN
    kernel), counts as the float32 CPU run does, module by module, with no op left uncounted."""
    cuda = _analysis(name, "cuda", dtype, backend=backend)
    cpu = _analysis(name, "cpu", torch.float32, backend=backend)
    assert cuda.unsupported_ops() == {}
    assert cuda.by_module() == cpu.by_module()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ATTENTION + ["resnet-50"])
def test_cuda_training_step_counts_equal_the_cpus_and_torchs_attention(name, dtype):
    """Forward and backward on the GPU's kernels, by phase as on the CPU; ResNet-50 in training
    mode (cuDNN's batch norm and its backward in float32). A fused attention kernel recomputes its
    scores in the backward; the math kernel, which CUDA may pick for float32 grouped-query
    attention (it did in one run on an H100 and not in another), keeps them and recomputes none.
    The attention kernels' FLOPs (forward, gradients, recomputed scores) equal FlopCounterMode's on
    the same GPU run (on the CPU it counts no attention kernel; on grouped-query attention it
    raises, its sdpa_flop_count asserting as many key heads as query heads: torch 2.11)."""
    analysis = _analysis(name, "cuda", dtype, backend="dispatch", backward=True, training=name == "resnet-50")
    assert analysis.unsupported_ops() == {}
    cuda = analysis.by_phase()
    cpu = _analysis(name, "cpu", torch.float32, backend="dispatch", backward=True, training=name == "resnet-50").by_phase()
    assert cuda["forward"] == cpu["forward"] and cuda["backward"] == cpu["backward"]
    assert cuda["recompute"] in (cpu["recompute"], 0)
    if name not in ("bert-base", "gpt2"):
        return
    model, args, kwargs = _example(name, "cuda", dtype)
    with FlopCounterMode(display=False) as torch_count:
        output = model(*args, **kwargs)
        sum(t.float().sum() for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()).backward()
    torch_attention = sum(flops for op, flops in torch_count.get_flop_counts()["Global"].items() if "attention" in str(op))
    ours = sum(macs for op, macs in analysis.by_operator().items() if "attention" in op)
    assert torch_attention > 0 and 2 * ours == torch_attention


def test_cli_profiles_on_cuda():
    """The README's first command on the GPU: CUDA-event timings beside the counts."""
    result = subprocess.run([sys.executable, "-m", "jitflops", "--example", "transformer", "--profile", "--device", "cuda"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "cuda" in result.stdout and "25.17 M" in result.stdout


@pytest.mark.parametrize("name, dtype", [("llama-gqa", torch.float32), ("gpt2", torch.bfloat16), ("resnet-50", torch.float32)], ids=str)
def test_cuda_memory_estimate_of_a_model_on_the_gpu_meets_torchs_trackers(name, dtype):
    """The estimate of a model on the GPU, on fake CUDA tensors (CUDA's kernel choices, such as the
    math SDPA kernel of float32 grouped-query attention, which holds its scores: on CPU fakes the
    estimate was 53% short), against MemTracker's peak of the same inference forward on the GPU,
    to the tensor; and within 10% of the caching allocator's peak, whose cuBLAS and cuDNN
    workspaces are no tensors (on an H100: -7% to +1%)."""
    model, args, kwargs = _example(name, "cuda", dtype)
    estimate = memory_footprint(model, args, kwargs).peak
    held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in [*tree_leaves((args, kwargs)), *model.parameters(), *model.buffers()] if isinstance(t, torch.Tensor)}
    with torch.no_grad():
        model(*args, **kwargs)  # kernels chosen, workspaces made
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker:
            output = model(*args, **kwargs)
        torch.cuda.synchronize()
    del output
    tracked = next(peak["Total"] for where, peak in tracker.get_tracker_snapshot("peak").items() if where.type == "cuda")
    inputs = sum(t.untyped_storage().nbytes() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
    assert estimate == pytest.approx(tracked + inputs, rel=1e-3)
    allocated = torch.cuda.max_memory_allocated() - before + sum(held.values())
    assert abs(estimate / allocated - 1) < 0.10, (estimate, allocated)


@pytest.mark.parametrize("op", ["add", "layer_norm", "attention"])
def test_cuda_calibration_times_a_kernel_as_torch_profiler_does(op):
    """The calibration's timer gives a small op its kernel's time, as ``torch.profiler`` measures it,
    not the host's time to issue it: on an H200, timed from an idle GPU, an add of 4,096 elements
    took 15 us and bfloat16 attention 130 us, against 1.3 and 5 us per kernel in a model."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from jitflops.timing.calibration.budget import CallTimer

    x = torch.randn(4, 1024, device="cuda")
    q = torch.randn(1, 12, 128, 64, device="cuda", dtype=torch.bfloat16)
    run = {"add": lambda: torch.add(x, x), "layer_norm": lambda: torch.nn.functional.layer_norm(x, (1024,)),
           "attention": lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)}[op]
    timed = CallTimer(torch.device("cuda"), flush=False).median(run, repeats=9)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        for _ in range(9):
            run()
        torch.cuda.synchronize()
    kernels = sum(event.self_device_time_total for event in profiler.events() if event.device_type == DeviceType.CPU) / 1e6 / 9
    assert kernels / 2 < timed < kernels + 4e-6


def test_cuda_a_host_bound_forward_is_its_calls_on_the_calibrated_host():
    """32 tiny linears and ReLUs at batch 1: each kernel takes a few us, each call far more, so the
    eager forward is the host's calls (a library's, cuBLAS's products, calibrated apart from a plain
    op's) and the modules'. The prediction on a spec calibrated here is within 30% of the forward
    timed without hooks."""
    import statistics
    import time

    from jitflops.estimates.roofline import PredictedTimeAnalysis
    from jitflops.timing.calibration import calibrate

    spec = calibrate("cuda", budget_s=10)
    assert spec.host_s["product"] > spec.host_s["op"]  # cuBLAS plans each call
    model = torch.nn.Sequential(*[layer for _ in range(32) for layer in (torch.nn.Linear(64, 64), torch.nn.ReLU())]).cuda()
    x = torch.randn(1, 64, device="cuda")
    samples = []
    with torch.no_grad():
        for _ in range(25):
            torch.cuda.synchronize()
            started = time.perf_counter()
            model(x)
            torch.cuda.synchronize()
            samples.append(time.perf_counter() - started)
    measured = statistics.median(samples[5:])
    predicted = PredictedTimeAnalysis(model, x, device=spec).total()
    assert abs(predicted / measured - 1) < 0.3, (predicted, measured)
