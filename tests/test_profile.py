"""The timed pass, the DeepSpeed-style profile, the training-loop profiler and the per-op table."""

from __future__ import annotations

import json
import mmap
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from jitflops import FlopCountAnalysis, FlopsProfiler, format_model_profile, get_model_profile, profile_model, time_model
from jitflops.examples import ConvNet, TinyTransformer

from helpers import assert_same_state, model_state

IDS = torch.randint(0, 1000, (2, 16))


def test_timed_pass_names_match_counts_and_have_statistics():
    model = TinyTransformer().eval()
    timed = time_model(model, IDS, warm_up=1, repeats=4)
    counted = set(FlopCountAnalysis(model, IDS).by_module())
    assert set(timed.modules) <= counted
    assert {"", "embed", "blocks.0", "blocks.0.attention.q", "head"} <= set(timed.modules)
    assert "blocks" not in timed.modules  # a ModuleList is never called
    root = timed.forward
    assert len(root.samples) == 4 and root.min <= root.median <= root.max and root.iqr >= 0
    assert timed.modules["blocks.0"].median < root.median
    assert timed.device == "cpu" and timed.untimed_forward.median > 0
    # each timed iteration is paired with one without hooks (how much the hooks cost is tools/bench.py's to measure)
    assert len(timed.untimed_forward.samples) == 4
    assert timed.overhead == timed.timed_forward.median / timed.untimed_forward.median - 1


def test_shared_module_calls_are_summed_under_one_name():
    layer = nn.Linear(8, 8)
    model = nn.Sequential(layer, nn.ReLU(), layer)
    timed = time_model(model, torch.randn(3, 8), repeats=2)
    assert timed.modules["0"].calls_per_iteration == 2 and "2" not in timed.modules


def test_profile_hierarchy_numbers_agree_with_the_analyses():
    model = ConvNet().eval()
    x = torch.randn(2, 3, 16, 16)
    profile = profile_model(model, x, repeats=3, with_ops=True)
    flops = FlopCountAnalysis(model, x)
    for node in profile.root.walk():
        assert node.macs == flops.total(node.name) and node.flops == 2 * node.macs
    assert profile.root.params == sum(p.numel() for p in model.parameters())
    assert profile.summary.batch_size == 2 and profile.summary.flops == 2 * flops.total()
    rate = profile.root.flops_per_second
    assert rate == pytest.approx(profile.summary.flops / profile.summary.forward.median)


def test_ignore_modules_removes_cost_from_parents():
    model = ConvNet().eval()
    x = torch.randn(1, 3, 16, 16)
    full = profile_model(model, x, repeats=2)
    pruned = profile_model(model, x, repeats=2, ignore_modules=[nn.BatchNorm2d])
    batch_norm_macs = sum(n.macs for n in full.root.walk() if n.type_name == "BatchNorm2d")
    assert batch_norm_macs > 0
    assert pruned.root.macs == full.root.macs - batch_norm_macs
    assert pruned.root.find("stem").macs == full.root.find("stem").macs - full.root.find("stem.1").macs
    assert all(node.type_name != "BatchNorm2d" for node in pruned.root.walk())


def test_get_model_profile_returns_deepspeed_figures(tmp_path, capsys):
    model = ConvNet().eval()
    flops, macs, params = get_model_profile(model, input_shape=(2, 3, 16, 16), print_profile=True, as_string=False, warm_up=1)
    expected_macs = FlopCountAnalysis(model, torch.randn(2, 3, 16, 16)).total()
    assert (flops, macs, params) == (2 * expected_macs, expected_macs, sum(p.numel() for p in model.parameters()))
    printed = capsys.readouterr().out
    assert "fwd MACs per GPU:" in printed and "Detailed Profile per GPU" in printed
    as_text = get_model_profile(model, args=[torch.randn(1, 3, 8, 8)], print_profile=True, output_file=str(tmp_path / "p.txt"))
    assert as_text[2] == "5.51 K" and as_text[1].endswith("MACs") and (tmp_path / "p.txt").read_text().lstrip().startswith("-" * 26)


def test_printout_depths_and_top_modules():
    model = TinyTransformer(depth=2).eval()
    profile = profile_model(model, IDS, repeats=2)
    text = format_model_profile(profile, module_depth=-1, top_modules=2)
    deepest = max(node.depth for node in profile.root.walk())
    assert f"depth {deepest}:" in text  # the innermost depth is included
    aggregated = text.split("Aggregated Profile per GPU")[1].split("Detailed Profile")[0]
    assert re.search(r"depth 1:\n    params      - \{'ModuleList': '[^']+', 'Embedding': '[^']+'\}", aggregated)
    shallow = format_model_profile(profile, module_depth=1, top_modules=1, detailed=True)
    assert "depth 2:" not in shallow and "(0): TransformerBlock(" in shallow and "(blocks): ModuleList(" in shallow  # the detailed tree is whole, as DeepSpeed's
    assert "flops = 2 x macs + elementwise_flops" in shallow


def _train(model, optimizer, steps, profiler=None, profile_step=1, raise_at=None):
    for step in range(steps):
        if profiler is not None and step == profile_step:
            profiler.start_profile()
        if step == raise_at:
            raise RuntimeError("data loader broke")
        loss = model(IDS).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if profiler is not None and step == profile_step:
            profiler.stop_profile()


def test_training_loop_profile_measures_backward_and_step():
    model = TinyTransformer().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    profiler = FlopsProfiler(model)
    _train(model, optimizer, steps=3, profiler=profiler)
    summary = profiler.profile(1).summary
    assert summary.backward is not None and summary.step is not None and summary.backward.median > 0 and summary.step.median > 0
    assert len(summary.forward.samples) == 1
    assert summary.iteration_latency == pytest.approx(summary.forward.median + summary.backward.median + summary.step.median)
    macs = FlopCountAnalysis(model, IDS).total()
    assert profiler.get_total_macs() == macs and profiler.get_total_flops() == 2 * macs
    assert profiler.get_total_flops() == 2 * macs  # asking twice does not double
    assert profiler.get_total_params() == sum(p.numel() for p in model.parameters())
    assert profiler.get_total_duration() == summary.forward.median
    expected_backward = FlopCountAnalysis(model, IDS, backend="dispatch", backward=True).by_phase()["backward"]
    assert summary.backward_macs == expected_backward and summary.backward_to_forward == 2.0  # every product and norm needs both gradients
    assert summary.backward_flops_per_second == pytest.approx(2 * expected_backward / summary.backward.median)
    printed = format_model_profile(profiler.profile(1))
    assert re.search(r"^bwd MACs per GPU \(measured by jitflops\): +[\d.]+ [KMG]?MACs = 2 x fwd$", printed, re.M)
    assert re.search(r"^bwd FLOPS per GPU = 2 \* fwd flops per GPU / bwd latency: +[\d.]+ [KMG]?FLOPS$", printed, re.M)
    profiler.end_profile()
    assert profile_model(model, IDS, repeats=1, backward=True).summary.backward_macs == expected_backward


def test_profiling_twice_does_not_double_and_reset_clears():
    model = TinyTransformer().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    profiler = FlopsProfiler(model)
    _train(model, optimizer, steps=2, profiler=profiler, profile_step=0)
    first = profiler.get_total_flops()
    _train(model, optimizer, steps=2, profiler=profiler, profile_step=1)
    assert profiler.get_total_flops() == first
    profiler.reset_profile()
    assert profiler.get_total_flops() == profiler.get_total_macs() == 0 and profiler.get_total_duration() == 0.0
    profiler.end_profile()


def test_end_profile_leaves_nothing_even_after_an_exception():
    model = TinyTransformer().train()
    before = model_state(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    profiler = FlopsProfiler(model)
    with pytest.raises(RuntimeError, match="data loader broke"):
        try:
            _train(model, optimizer, steps=3, profiler=profiler, profile_step=1, raise_at=2)
        finally:
            profiler.end_profile()
    assert_same_state(before, model_state(model))
    assert not profiler.started


def test_shared_module_counted_once_in_the_profile():
    shared = nn.Linear(8, 8)

    class TwoParents(nn.Module):
        def __init__(self):
            super().__init__()
            self.left = nn.Sequential(shared)
            self.right = nn.Sequential(shared)

        def forward(self, x):
            return self.right(self.left(x))

    profile = profile_model(TwoParents(), torch.randn(4, 8), repeats=2)
    assert profile.root.params == 72 and profile.root.macs == 2 * 4 * 64
    names = [node.name for node in profile.root.walk()]
    assert names.count("left.0") == 1 and "right.0" not in names


@pytest.mark.parametrize("backend", ["jit", "dispatch"])
def test_per_op_table_rows(backend):
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    profile = profile_model(model, x, repeats=1, with_ops=True, backend=backend)
    rows = profile.op_rows
    assert [(r.module, r.op) for r in rows] == [("0", "aten::linear"), ("1", "aten::relu"), ("2", "aten::linear")]
    assert [r.macs for r in rows] == [8 * 16 * 32, None, 8 * 32 * 4]
    assert rows[0].input_shapes[0] == [8, 16] and rows[0].flops == 2 * 8 * 16 * 32
    assert rows[0].memory_delta == 8 * 32 * 4 and rows[1].memory_before == rows[0].memory_after  # float32 output
    assert all(r.time_s > 0 for r in rows)
    assert sum(r.macs or 0 for r in rows) == profile.summary.macs


FAULTS_IN_A_FRESH_PROCESS = """
import json, sys, torch
from torch import nn
from jitflops import format_model_profile, profile_model

class FreshBuffer(nn.Module):
    def forward(self, x):
        return torch.ones(12 * 2**20).sum() + x  # 48 MiB, filled

fresh = profile_model(FreshBuffer(), torch.zeros(1), repeats=3)
reused = profile_model(nn.Linear(64, 64), torch.randn(8, 64), repeats=3)
json.dump({"faults": [fresh.summary.page_faults, reused.summary.page_faults],
           "printed": [format_model_profile(fresh), format_model_profile(reused)]}, sys.stdout)
"""
"""A forward that fills a new 48 MiB tensor at every call, and one that allocates 2 KiB, profiled in
a process of their own: past the largest threshold (32 MiB) below which glibc keeps freed memory
for reuse, so each call maps, and faults in, fresh pages. (In a worker of the suite that had run
hundreds of tests before, the same forward faulted none: its 48 MiB came from pages the process
already had, and the kernel's count, which the timed pass reports, was 0.)"""


def _huge_pages_always() -> bool:
    settings = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return settings.exists() and "[always]" in settings.read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator and the kernel's fault count")
def test_the_timed_pass_counts_the_pages_each_forward_faults_in():
    run = subprocess.run([sys.executable, "-c", FAULTS_IN_A_FRESH_PROCESS], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    measured = json.loads(run.stdout)
    faults, (printed, quiet) = measured["faults"], measured["printed"]
    pages = 48 * 2**20 // mmap.PAGESIZE  # one fault a page, or one per 2 MiB where the kernel backs the mapping with huge pages
    fewest = 48 // 2 - 2 if _huge_pages_always() else pages
    assert fewest <= faults[0] <= pages + 256, faults
    assert faults[1] < 64, faults
    assert re.search(rf"^minor page faults per fwd \(fresh pages, without hooks\): +{faults[0]:,} ", printed, re.M)
    assert "note: each fwd faults in memory its allocator gave back to the OS" in printed and "note: each fwd faults" not in quiet


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux's count of every core's busy time")
def test_the_timed_pass_reads_the_cores_other_processes_kept_busy():
    """A process spinning beside the timed pass reads as most of a core (with the suite's other
    worker, more), and the printout says what that does to the latencies: no reading, or one of
    idle cores, fails."""
    model, x = nn.Linear(1024, 1024), torch.randn(256, 1024)
    spinning = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        profile = profile_model(model, x, repeats=40)
    finally:
        spinning.kill()
        spinning.wait()
    assert profile.summary.other_cores is not None and profile.summary.other_cores >= 0.5, profile.summary.other_cores
    printed = format_model_profile(profile)
    assert re.search(r"^other processes' CPU while timed \(cores busy\): +\d+\.\d\d", printed, re.M)
    assert f"note: other processes kept {profile.summary.other_cores:.2f} cores busy while this was timed" in printed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_timed_pass_and_profile():
    model = ConvNet().cuda().eval()
    x = torch.randn(8, 3, 32, 32, device="cuda")
    profile = profile_model(model, x, repeats=5, with_ops=True)
    assert profile.summary.device.startswith("cuda")
    assert profile.root.latency.median > 0 and profile.root.find("stem.0").latency.median > 0
    assert any(row.memory_delta > 0 for row in profile.op_rows)
    assert sum(row.macs or 0 for row in profile.op_rows) == profile.summary.macs

