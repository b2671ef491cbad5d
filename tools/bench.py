"""Benchmark: what jitflops costs next to the trace it needs, fvcore and FlopCounterMode.

For each model of the zoo, interleaved over several rounds (at least ``--repeats``; small models get
more, see :data:`ROUND_SECONDS`), medians reported, and each ratio the median of the two tools'
ratios round by round:

* ``forward``: the model's own forward, under ``no_grad``;
* ``trace``: bare ``torch.jit._get_trace_graph`` of the model on its real values, no hooks (the
  floor of a count that computes);
* ``jitflops``: the default ``FlopCountAnalysis(...).total()`` from a fresh object: the JIT trace's
  records read from the model's calls where they can be (``jitflops.frontends.call_recording``),
  traced otherwise, on meta values where that pays off (``jitflops.frontends.meta_values``);
* ``jitflops real``: the same with real values forced (``compute=True``), which traces: the JIT's cost;
* ``jitflops+reports``: the default, then ``by_module()``, ``by_operator()`` and ``flop_count_table()``;
* ``dispatch``: ``FlopCountAnalysis(..., backend="dispatch").total()``;
* ``export``: ``FlopCountAnalysis(..., backend="export").total()`` (``torch.export`` included);
* ``fvcore``: fvcore's ``FlopCountAnalysis(...).total()`` (wrapped as fvcore needs);
* ``FlopCounterMode``: ``torch.utils.flop_counter`` on the same forward;
* ``FCM fake``: ``FlopCounterMode`` under ``FakeTensorMode`` (no arithmetic);
* the other peers a user could pick, where installed (``pip install --no-deps ptflops thop
  calflops``): ptflops' ``pytorch`` (module hooks) and ``aten`` (a dispatch mode) backends,
  thop's ``profile`` and calflops' ``calculate_flops``. A tool that fails on a model is listed
  with its error, not timed; ``jf/fastest peer`` is the default count's time over the fastest peer's
  that ran, round by round.

``--only fresh``: each tool's first count in a new process (``python -c``: import torch and the tool,
build a small CNN, count it once), timed whole, interpreter start included: what a script or a
command line pays for one count.

``--only search``: counting 1,000 candidates of a MobileNet-like search space (blocks of random
depth, width, expansion and kernel size, on a 3 x 64 x 64 image), each tool's counts per second
(the full run measures it in a fresh process, as a search runs).

Peak memory (RSS) of the counting tools is measured in a fresh subprocess per model and tool. Then
the scale checks: a Llama-shaped model with 1.2B real bf16 parameters at 4096 tokens (time, extra
peak RSS over the loaded model), the 70B Llama configuration on the meta device (time, peak RSS),
the growth of the analysis time when the layer count doubles, and the timing overhead of the
profile's timed pass on BERT-base. Then the bytes: what counting them adds to a count (the bytes
from the count's own recording). Prints one table and writes the same figures as JSON. (The
predicted time's error is measured in rounds by ``tools/time_accuracy.py``.)

    python tools/bench.py                   # everything (about 25 minutes on 2 cores)
    python tools/bench.py --models bert-base resnet-50 --repeats 3 --json /tmp/bench.json
    python tools/bench.py --only search     # one section (bytes, search, fresh), its JSON entry replaced
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jitflops import FlopCountAnalysis, flop_count_table  # noqa: E402
from jitflops.examples import ZOO  # noqa: E402
from jitflops.core.model_io import FlatCall, ModelCall, tensor_leaves  # noqa: E402
from jitflops.core.table import pipe_table  # noqa: E402

DEFAULT_MODELS = [name for name, example in ZOO.items() if "zoo" in example.tags] + ["bert-large", "vit-l16", "llama-8b"]
PEERS = ("FlopCounterMode", "fvcore", "ptflops pytorch", "ptflops aten", "thop", "calflops")
"""The counters a user could pick instead of jitflops."""
TOOLS = ("forward", "trace", "jitflops", "jitflops real", "jitflops+reports", "dispatch", "export", "FCM fake", *PEERS)
MEMORY_TOOLS = ("jitflops", "jitflops real", "fvcore", "FlopCounterMode")
SECTIONS = {"bytes": "byte_count_cost", "search": "search_space", "fresh": "fresh_process"}
"""The sections ``--only`` runs alone, and their entries in the JSON."""
META_TOOLS = ("trace", "jitflops", "jitflops+reports", "export")
"""What runs on a model built on the meta device: fvcore's handles, FlopCounterMode and the
dispatch backend need values."""


def device_for(name: str) -> str:
    return "meta" if "meta" in ZOO[name].tags else "cpu"


class FvcoreReady(torch.nn.Module):
    """Positional tensors in, a tuple of tensors out: what fvcore's tracer accepts."""

    def __init__(self, model: torch.nn.Module, keyword_names: list[str]) -> None:
        super().__init__()
        self.model, self.keyword_names = model, keyword_names

    def forward(self, *args: Any) -> tuple:
        if self.keyword_names:
            return tensor_leaves(self.model(**dict(zip(self.keyword_names, args))))
        return tensor_leaves(self.model(*args))


def make_runners(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Callable[[], float]]:
    """Each tool as a function that runs it once and returns the total it reports (MACs)."""
    from fvcore.nn import FlopCountAnalysis as FvcoreFlops
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    call = ModelCall(args, kwargs)

    def forward() -> float:
        with torch.no_grad():
            model(*args, **kwargs)
        return float("nan")

    def bare_trace() -> float:
        runner = FlatCall(model, call)
        with torch.no_grad():
            torch.jit._get_trace_graph(runner, runner.flat_inputs())
        return float("nan")

    def jitflops_total(**settings: Any) -> float:
        return FlopCountAnalysis(model, args, kwargs, **settings).unsupported_ops_warnings(False).uncalled_modules_warnings(False).total()

    def jitflops_reports() -> float:
        analysis = FlopCountAnalysis(model, args, kwargs).unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        total = analysis.total()
        analysis.by_module()
        analysis.by_operator()
        flop_count_table(analysis)
        return total

    def fvcore_total() -> float:
        wrapped = FvcoreReady(model, list(kwargs))
        positional = tuple(kwargs.values()) or args
        return FvcoreFlops(wrapped, positional).unsupported_ops_warnings(False).uncalled_modules_warnings(False).total()

    def flop_counter_mode(fake: bool = False) -> float:
        with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext(), FlopCounterMode(display=False) as counter:
            model(*args, **kwargs)
        return counter.get_total_flops() / 2  # it counts a multiply-add as 2

    return {
        "forward": forward,
        "trace": bare_trace,
        "jitflops": jitflops_total,
        "jitflops real": lambda: jitflops_total(compute=True),
        "jitflops+reports": jitflops_reports,
        "dispatch": lambda: jitflops_total(backend="dispatch"),
        "export": lambda: jitflops_total(backend="export"),
        "fvcore": fvcore_total,
        "FlopCounterMode": flop_counter_mode,
        "FCM fake": lambda: flop_counter_mode(fake=True),
        **peer_runners(model, args, kwargs),
    }


def peer_runners(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Callable[[], float]]:
    """ptflops (both backends), thop and calflops, each called as its README shows, on the model's
    own inputs; each returns the MACs it reports."""
    wrapped = FvcoreReady(model, list(kwargs))
    positional = tuple(kwargs.values()) or args

    def ptflops(backend: str) -> float:
        from ptflops import get_model_complexity_info

        if not kwargs and len(args) != 1:
            raise ValueError("ptflops calls a model with one input or with keyword inputs")
        batch = dict(kwargs) if kwargs else args[0]  # a dict is passed as keywords, anything else as the one input
        with torch.no_grad():
            macs, _ = get_model_complexity_info(model, (1,), input_constructor=lambda _: batch, as_strings=False, print_per_layer_stat=False,
                                                backend=backend, verbose=False)
        if macs is None:
            raise RuntimeError("ptflops returned no count (it prints the error it caught)")
        return float(macs)

    def thop() -> float:
        import thop as thop_package

        with torch.no_grad():
            macs, _ = thop_package.profile(wrapped, inputs=positional, verbose=False)
        return float(macs)

    def calflops() -> float:
        from calflops import calculate_flops

        with torch.no_grad():
            _, macs, _ = calculate_flops(model, args=list(args), kwargs=dict(kwargs), print_results=False, print_detailed=False, output_as_string=False)
        return float(macs)

    return {"ptflops pytorch": lambda: ptflops("pytorch"), "ptflops aten": lambda: ptflops("aten"), "thop": thop, "calflops": calflops}


def engine_cost(model: torch.nn.Module, args: tuple, kwargs: dict, repeats: int) -> tuple[int, float]:
    """Graph nodes, and the median seconds of the engine alone (records, handles, aggregation) on a kept trace."""
    analysis = FlopCountAnalysis(model, args, kwargs).unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    nodes = sum(1 for _ in analysis.scoped_trace().graph.nodes())
    samples = []
    for _ in range(repeats + 1):
        analysis.clear_op_handles().set_op_handle(**FlopCountAnalysis(model, args, kwargs)._op_handles)
        start = time.perf_counter()
        analysis.total()
        samples.append(time.perf_counter() - start)
    return nodes, statistics.median(samples[1:])


ROUND_SECONDS = 10.0
"""Small models get more rounds (up to :data:`MAX_ROUNDS`), so that each model's timing takes
about this long: a 2-core VM's noise is a few percent of a 100 ms run."""
MAX_ROUNDS = 25

RATIOS = {
    "jitflops/forward": ("jitflops", "forward"),
    "jitflops/FlopCounterMode": ("jitflops", "FlopCounterMode"),
    "jitflops real/trace": ("jitflops real", "trace"),
    "jitflops/fvcore": ("jitflops", "fvcore"),
    "dispatch/FlopCounterMode": ("dispatch", "FlopCounterMode"),
}
"""Each ratio is the median over rounds of the two tools' times in the same round (paired: a slow
moment of the machine slows both). On a meta-device model, where nothing computes, "jitflops real"
is "jitflops"."""


def paired_ratios(seconds: dict[str, list[float]]) -> dict[str, float]:
    ratios = {}
    for ratio, (first, second) in RATIOS.items():
        if first not in seconds and first == "jitflops real":
            first = "jitflops"
        if first in seconds and second in seconds:
            ratios[ratio] = statistics.median(a / b for a, b in zip(seconds[first], seconds[second]))
    return ratios


_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")


def _hook_keys(model: torch.nn.Module) -> dict[torch.nn.Module, dict[str, set[int]]]:
    return {module: {table: set(getattr(module, table)) for table in _HOOK_TABLES} for module in model.modules()}


def remove_leftover_hooks(model: torch.nn.Module, before: dict[torch.nn.Module, dict[str, set[int]]]) -> None:
    """Remove the module hooks a tool left behind (ptflops' ``aten`` backend leaves a forward hook
    and a pre-hook on each of the model's top modules): no tool runs another's, and none is timed
    on a model whose hooks another left."""
    for module, tables in before.items():
        for table, keys in tables.items():
            hooks = getattr(module, table)
            for key in set(hooks) - keys:
                del hooks[key]


def time_tools(name: str, repeats: int, tools: tuple[str, ...]) -> dict[str, Any]:
    model, args, kwargs = ZOO[name].instantiate(device_for(name))
    runners = make_runners(model, args, kwargs)
    clean = _hook_keys(model)
    if device_for(name) == "meta":
        tools = tuple(t for t in tools if t in META_TOOLS)
    totals: dict[str, float] = {}
    failed: dict[str, str] = {}
    start = time.perf_counter()
    for tool in tools:  # one untimed run each: imports, caches; a tool that fails is listed, not timed
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                totals[tool] = runners[tool]()
        except Exception as error:
            failed[tool] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:160] if str(error).strip() else ''}"
        remove_leftover_hooks(model, clean)
    tools = tuple(tool for tool in tools if tool not in failed)
    seconds: dict[str, list[float]] = {tool: [] for tool in tools}
    rounds = min(MAX_ROUNDS, max(repeats, int(ROUND_SECONDS / (time.perf_counter() - start))))
    for _ in range(rounds):
        for tool in tools:
            gc.collect()
            with contextlib.redirect_stdout(io.StringIO()):  # ptflops and thop print
                start = time.perf_counter()
                runners[tool]()
                seconds[tool].append(time.perf_counter() - start)
            remove_leftover_hooks(model, clean)
    nodes, engine_s = engine_cost(model, args, kwargs, repeats)
    return {
        "model": name,
        "device": device_for(name),
        "nodes": nodes,
        "rounds": rounds,
        "engine_s": engine_s,
        "median_s": {tool: statistics.median(values) for tool, values in seconds.items()},
        "ratios": {**paired_ratios(seconds), **fastest_peer(seconds)},
        "totals": {tool: totals[tool] for tool in tools if tool not in ("trace", "forward")},
        "failed": failed,
    }


def fastest_peer(seconds: dict[str, list[float]]) -> dict[str, Any]:
    """The default count's time over the fastest peer's, round by round (median), and which peer
    was fastest most often."""
    peers = [tool for tool in PEERS if tool in seconds]
    if "jitflops" not in seconds or not peers:
        return {}
    rounds = range(len(seconds["jitflops"]))
    fastest = [min(peers, key=lambda tool: seconds[tool][index]) for index in rounds]
    return {"jitflops/fastest peer": statistics.median(seconds["jitflops"][index] / seconds[fastest[index]][index] for index in rounds),
            "fastest peer": statistics.mode(fastest)}


PEAK_RSS_MIB = "print(int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]) / 1024)"
"""The process's own high-water mark: ``ru_maxrss`` would include the parent's, inherited over fork and exec."""


def peak_rss_mib(name: str, tool: str) -> float:
    """Peak RSS of a fresh process that builds the model and runs ``tool`` once, in MiB."""
    code = (
        "import sys, logging, warnings; warnings.simplefilter('ignore'); logging.disable(logging.WARNING);"
        f"sys.path.insert(0, {str(REPO / 'tools')!r}); import bench;"
        f"from jitflops.examples import ZOO; m, a, k = ZOO[{name!r}].instantiate(bench.device_for({name!r}));"
        f"bench.make_runners(m, a, k)[{tool!r}]();"
        + PEAK_RSS_MIB
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"{name}/{tool}: {result.stderr[-500:]}")
    return float(result.stdout.strip().splitlines()[-1])


def llama_1b_bf16() -> dict[str, float]:
    """Count the 1.2B Llama shape with real bf16 weights at 4096 tokens in a fresh process: the
    count's seconds, and its peak RSS over the loaded model (the high-water mark is reset after
    loading, through ``/proc/self/clear_refs``)."""
    code = (
        "import time, logging, torch; logging.disable(logging.WARNING); torch.manual_seed(0);"
        "from jitflops import FlopCountAnalysis; from jitflops.examples import ZOO;"
        "torch.set_default_dtype(torch.bfloat16); m, a, k = ZOO['llama-1b'].instantiate('cpu'); torch.set_default_dtype(torch.float32);"
        "params = sum(p.numel() for p in m.parameters()); loaded = int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]) / 1024;"
        "open('/proc/self/clear_refs', 'w').write('5');"
        "start = time.perf_counter(); f = FlopCountAnalysis(m, a, k); total = f.total(); seconds = time.perf_counter() - start;"
        "peak = int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]) / 1024;"
        "print(params, seconds, total, loaded, peak)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, cwd=REPO)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-800:])
    params, seconds, total, loaded, peak = map(float, result.stdout.split())
    return {"params": params, "count_s": seconds, "total_macs": total, "loaded_rss_mib": loaded, "extra_peak_rss_mib": peak - loaded}


def llama_70b() -> dict[str, float]:
    """Count the 70B configuration on meta in a fresh process, called as training and evaluation loops
    call it (``use_cache=False``): seconds and peak RSS."""
    code = (
        "import time, logging; logging.disable(logging.WARNING);"
        "from jitflops import FlopCountAnalysis; from jitflops.examples import ZOO;"
        "start = time.perf_counter(); m, a, k = ZOO['llama-70b'].instantiate('meta'); built = time.perf_counter();"
        "f = FlopCountAnalysis(m, a, {**k, 'use_cache': False}); total = f.total(); done = time.perf_counter();"
        "assert not f.unsupported_ops(), f.unsupported_ops();"
        "print(built - start, done - built, total, f.by_operator()['scaled_dot_product_attention'], end=' ');"
        + PEAK_RSS_MIB
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, cwd=REPO)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-800:])
    build_s, count_s, total, attention, rss = map(float, result.stdout.split())
    return {"build_s": build_s, "count_s": count_s, "total_macs": total, "attention_macs": attention, "peak_rss_mib": rss}


def scaling(repeats: int) -> dict[str, float]:
    """Analysis time at 12 and 24 BERT layers: doubling the layers should double the time."""
    import transformers

    medians = {}
    for layers in (12, 24):
        torch.manual_seed(0)
        model = transformers.BertModel(transformers.BertConfig(num_hidden_layers=layers)).eval()
        ids = torch.randint(0, 1000, (1, 128))
        run = make_runners(model, (ids,), {})["jitflops"]
        run()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            samples.append(time.perf_counter() - start)
        medians[layers] = statistics.median(samples)
    return {"layers_12_s": medians[12], "layers_24_s": medians[24], "ratio": medians[24] / medians[12]}


def timing_overhead(repeats: int) -> dict[str, float]:
    """The profile's timed pass on BERT-base: forward with timing hooks vs without, same run."""
    from jitflops import time_model

    model, args, kwargs = ZOO["bert-base"].instantiate()
    timed = time_model(model, args, kwargs, warm_up=3, repeats=repeats)
    return {"with_hooks_s": timed.timed_forward.median, "without_hooks_s": timed.untimed_forward.median, "overhead": timed.overhead}


def sharded_profiling_cost(steps: int = 101, alternations: int = 3) -> dict[str, float]:
    """The README's FSDP2 x tensor-parallel example on 4 gloo processes: ``steps`` training steps
    with the last one profiled by ``FlopsProfiler``, against the same steps without the profiler,
    alternated in one run.

    The cost is measured twice: inside each profiled run (the profiled step, printouts included,
    over that run's median unprofiled step: the steps of the same processes, so the noise of 4
    processes on 2 cores is the step's, not the run's), and as the profiled runs' extra time over
    the plain runs' (the same figure with the whole run's noise)."""
    import re

    seconds: dict[str, list[float]] = {"profiled": [], "plain": []}
    in_run_steps: list[float] = []
    for _ in range(alternations):
        for variant, flags in (("profiled", []), ("plain", ["--no-profile"])):
            result = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", "examples/sharded_llama.py", "--steps", str(steps), *flags],
                cwd=REPO, capture_output=True, text=True, timeout=600,
            )
            if result.returncode != 0:
                raise RuntimeError(result.stderr[-800:])
            seconds[variant].append(float(re.search(r"seconds for steps 1 to \d+: ([\d.]+)", result.stdout).group(1)))
            if variant == "profiled":
                unprofiled, profiled_step = map(float, re.search(r"unprofiled ([\d.]+) \(median\), the profiled step \(with its printouts\) ([\d.]+)", result.stdout).groups())
                in_run_steps.append((profiled_step - unprofiled) / unprofiled)
    profiled, plain = statistics.median(seconds["profiled"]), statistics.median(seconds["plain"])
    step = plain / (steps - 1)
    cost_in_steps = statistics.median(in_run_steps)
    return {"steps": steps - 1, "cost_in_steps": cost_in_steps, "cost": cost_in_steps / (steps - 1), "steps_for_5_percent": cost_in_steps / 0.05,
            "profiled_s": profiled, "plain_s": plain, "run_cost": profiled / plain - 1, "run_cost_in_steps": (profiled - plain) / step}


def byte_count_cost(models: list[str], repeats: int) -> dict[str, dict[str, float]]:
    """Per model, the median time of a fresh traced count (as a profile takes it: the default count
    reads most models from their calls, and bytes need the trace's records of every op), of its
    bytes and of its predicted time on the H100's datasheet from the same recording (what a profile
    adds), with their ratios; and of the default count, from the model's calls where it can be, and
    of ``PredictedTimeAnalysis`` made afresh by the JIT and by the dispatch backend (its default):
    what a prediction costs against the count it comes from."""
    from jitflops import ByteCountAnalysis
    from jitflops.estimates.roofline import PredictedTimeAnalysis

    costs = {}
    for name in models:
        model, args, kwargs = ZOO[name].instantiate(device_for(name))
        seconds: dict[str, list[float]] = {"count_s": [], "bytes_s": [], "priced_s": [], "default_count_s": [], "jit_prediction_s": [], "dispatch_prediction_s": []}
        for _ in range(repeats):
            marks = [time.perf_counter()]
            flops = FlopCountAnalysis(model, args, kwargs)
            flops.scoped_trace()
            flops.total()
            marks.append(time.perf_counter())
            flops.of_same_recording(ByteCountAnalysis).total()
            marks.append(time.perf_counter())
            flops.of_same_recording(PredictedTimeAnalysis, device="h100").total()
            marks.append(time.perf_counter())
            FlopCountAnalysis(model, args, kwargs).unsupported_ops_warnings(False).uncalled_modules_warnings(False).total()
            marks.append(time.perf_counter())
            for backend in ("jit", "dispatch"):
                PredictedTimeAnalysis(model, args, kwargs, device="h100", backend=backend).unsupported_ops_warnings(False).uncalled_modules_warnings(False).total()
                marks.append(time.perf_counter())
            for key, begin, end in zip(seconds, marks, marks[1:]):
                seconds[key].append(end - begin)
        costs[name] = {key: statistics.median(values) for key, values in seconds.items()}
        costs[name]["added"] = costs[name]["bytes_s"] / costs[name]["count_s"]
        costs[name]["prediction_to_count"] = costs[name]["dispatch_prediction_s"] / costs[name]["default_count_s"]
    return costs


def print_byte_count_cost(costs: dict[str, dict[str, float]]) -> None:
    rows = [[name, f"{c['count_s'] * 1e3:.1f}", f"{c['bytes_s'] * 1e3:.1f}", f"+{100 * c['added']:.1f}%", f"{c['priced_s'] * 1e3:.1f}",
             f"{c['default_count_s'] * 1e3:.1f}", f"{c['jit_prediction_s'] * 1e3:.1f}", f"{c['dispatch_prediction_s'] * 1e3:.1f}",
             f"{c['prediction_to_count']:.1f}x"] for name, c in costs.items()]
    print(pipe_table(rows, ["model", "traced count ms", "bytes ms (same recording)", "added", "predicted time ms (same recording)",
                            "default count ms", "prediction ms (JIT)", "prediction ms (dispatch, the default)", "prediction / count"]))


class _Block(torch.nn.Module):
    """An inverted residual block (MobileNetV2's) of a search space's candidate."""

    def __init__(self, inputs: int, outputs: int, expansion: int, kernel: int, stride: int) -> None:
        super().__init__()
        hidden = inputs * expansion
        self.expand = torch.nn.Sequential(torch.nn.Conv2d(inputs, hidden, 1, bias=False), torch.nn.BatchNorm2d(hidden), torch.nn.ReLU6())
        self.depthwise = torch.nn.Sequential(torch.nn.Conv2d(hidden, hidden, kernel, stride, kernel // 2, groups=hidden, bias=False),
                                             torch.nn.BatchNorm2d(hidden), torch.nn.ReLU6())
        self.project = torch.nn.Sequential(torch.nn.Conv2d(hidden, outputs, 1, bias=False), torch.nn.BatchNorm2d(outputs))
        self.residual = stride == 1 and inputs == outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.depthwise(self.expand(x)))
        return x + y if self.residual else y


def candidate(seed: int) -> torch.nn.Module:
    """One candidate of the search space: a stem, 2 to 6 stages of 1 to 3 blocks (width 16 to 96,
    expansion 1, 3 or 6, kernel 3 or 5), a classifier."""
    draw = random.Random(seed)
    layers: list[torch.nn.Module] = [torch.nn.Conv2d(3, 16, 3, 2, 1, bias=False), torch.nn.BatchNorm2d(16), torch.nn.ReLU6()]
    width = 16
    for stage in range(draw.randint(2, 6)):
        out = draw.choice((16, 24, 32, 48, 64, 96))
        for block in range(draw.randint(1, 3)):
            layers.append(_Block(width, out, draw.choice((1, 3, 6)), draw.choice((3, 5)), 2 if block == 0 and stage % 2 else 1))
            width = out
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(width, 10)]
    return torch.nn.Sequential(*layers).eval()


def search_space(candidates: int = 1000) -> dict[str, Any]:
    """Each tool counting the same ``candidates`` models of the search space, one after another
    (each model built once, outside the timing): counts per second, and whether the totals agree."""
    image = torch.randn(1, 3, 64, 64)
    models = [candidate(seed) for seed in range(candidates)]
    results: dict[str, Any] = {"candidates": candidates, "counts_per_second": {}, "failed": {}}
    for tool in ("jitflops", "dispatch", "export", "FCM fake", *PEERS):
        totals = []
        gc.collect()  # the models just built, and the tool before's garbage: collected before each tool, not in the first one's time
        start = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                for model in models:
                    totals.append(make_runners(model, (image,), {})[tool]())
        except Exception as error:
            results["failed"][tool] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:160] if str(error).strip() else ''}"
            continue
        results["counts_per_second"][tool] = candidates / (time.perf_counter() - start)
        results.setdefault("totals", {})[tool] = sum(totals)
    return results


def search_space_in_fresh_process() -> dict[str, Any]:
    """:func:`search_space` in a new process, as a search would run: after the zoo's large models,
    the JIT tracers ran up to twice as slow in the same process (2026-11-26: jitflops 26 candidates
    a second there against 54 in a fresh one, fvcore 13 against 25), the other tools less."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "search.json"
        subprocess.run([sys.executable, __file__, "--only", "search", "--json", str(path)], check=True, stdout=subprocess.DEVNULL)
        return json.loads(path.read_text())["search_space"]


FRESH_MODEL = (
    "import torch\n"
    "from torch import nn\n"
    "model = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(), nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False),\n"
    "                      nn.BatchNorm2d(16), nn.ReLU6(), nn.Conv2d(16, 32, 1, bias=False), nn.BatchNorm2d(32), nn.AdaptiveAvgPool2d(1),\n"
    "                      nn.Flatten(), nn.Linear(32, 10)).eval()\n"
    "x = torch.randn(1, 3, 64, 64)\n"
)
"""The model every fresh process counts: a MobileNet-like stem, block and head (no transformers, whose
import would dwarf every tool's)."""
FRESH_COUNTS = {
    "jitflops": "from jitflops import FlopCountAnalysis\nFlopCountAnalysis(model, x).unsupported_ops_warnings(False).uncalled_modules_warnings(False).total()",
    "FlopCounterMode": "from torch.utils.flop_counter import FlopCounterMode\nwith torch.no_grad(), FlopCounterMode(display=False) as counter:\n    model(x)\ncounter.get_total_flops()",
    "fvcore": "from fvcore.nn import FlopCountAnalysis\nFlopCountAnalysis(model, x).unsupported_ops_warnings(False).uncalled_modules_warnings(False).total()",
    "ptflops pytorch": "from ptflops import get_model_complexity_info\nget_model_complexity_info(model, (3, 64, 64), as_strings=False, print_per_layer_stat=False, backend='pytorch', verbose=False)",
    "ptflops aten": "from ptflops import get_model_complexity_info\nget_model_complexity_info(model, (3, 64, 64), as_strings=False, print_per_layer_stat=False, backend='aten', verbose=False)",
    "thop": "import thop\nthop.profile(model, inputs=(x,), verbose=False)",
    "calflops": "from calflops import calculate_flops\ncalculate_flops(model, args=[x], print_results=False, print_detailed=False, output_as_string=False)",
}
"""Each tool's one count, as its README shows it."""


def fresh_process(repeats: int) -> dict[str, Any]:
    """Each tool's first count in a new process, interleaved over ``repeats`` rounds after an untimed
    one: median seconds of the whole process, and ``import torch`` alone beside them (the floor every
    tool shares). Bytecode is cached as in an installed package: where ``PYTHONDONTWRITEBYTECODE`` is
    set (this machine sets it), an editable install compiles every module of its own at each import
    (about 0.1 s of jitflops'), which a wheel's users never pay."""
    scripts = {"import torch": "import torch", **{tool: FRESH_MODEL + count for tool, count in FRESH_COUNTS.items()}}
    seconds: dict[str, list[float]] = {tool: [] for tool in scripts}
    failed: dict[str, str] = {}
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    for round_ in range(repeats + 1):
        for tool, script in scripts.items():
            if tool in failed:
                continue
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, cwd=tempfile.gettempdir(), env=environment)
            if done.returncode:
                failed[tool] = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:160]
            elif round_:
                seconds[tool].append(time.perf_counter() - start)
    medians = {tool: statistics.median(times) for tool, times in seconds.items() if times}
    peers = {tool: medians[tool] for tool in PEERS if tool in medians}
    fastest = min(peers, key=peers.__getitem__)
    return {"rounds": repeats, "median_s": medians, "failed": failed, "fastest peer": fastest, "jitflops/fastest peer": medians["jitflops"] / peers[fastest]}


def print_fresh_process(fresh: dict[str, Any]) -> None:
    print(f"\nA first count in a fresh process (small CNN, whole process, median of {fresh['rounds']}): "
          + ", ".join(f"{tool} {seconds:.2f} s" for tool, seconds in sorted(fresh["median_s"].items(), key=lambda item: item[1]))
          + f"; jitflops / fastest peer ({fresh['fastest peer']}) {fresh['jitflops/fastest peer']:.2f}")
    for tool, error in fresh["failed"].items():
        print(f"  {tool} fails: {error}")


def print_search_space(search: dict[str, Any]) -> None:
    rates = search["counts_per_second"]
    print(f"\nSearch space: {search['candidates']} MobileNet-like candidates, counts per second: "
          + ", ".join(f"{tool} {rate:.1f}" for tool, rate in sorted(rates.items(), key=lambda item: -item[1])))
    for tool, error in search["failed"].items():
        print(f"  {tool} fails: {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=DEFAULT_MODELS, choices=sorted(ZOO))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-memory", action="store_true", help="skip the per-tool peak RSS subprocesses")
    parser.add_argument("--json", default=str(REPO / "tools" / "bench_results.json"))
    parser.add_argument("--only", choices=tuple(SECTIONS), help="run one section alone, printed; its entry in the JSON is replaced")
    options = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    bytes_models = [name for name in options.models if name in ("bert-base", "gpt2", "resnet-50", "mobilenet-v2", "llama-gqa", "vit-b16", "t5-small", "llama-8b")]
    if options.only == "bytes":
        section: Any = byte_count_cost(bytes_models, options.repeats)
        print_byte_count_cost(section)
    elif options.only == "search":
        section = search_space()
        print_search_space(section)
    elif options.only == "fresh":
        section = fresh_process(max(options.repeats, 7))
        print_fresh_process(section)
    if options.only:
        path = Path(options.json)
        document = json.loads(path.read_text()) if path.exists() else {}
        document[SECTIONS[options.only]] = section
        path.write_text(json.dumps(document, indent=2))
        return

    results = []
    for name in options.models:
        row = time_tools(name, options.repeats, TOOLS)
        if not options.no_memory:
            row["peak_rss_mib"] = {tool: peak_rss_mib(name, tool) for tool in row["median_s"] if tool in MEMORY_TOOLS}
        results.append(row)
        print(f"measured {name}", file=sys.stderr, flush=True)
    real_1b = llama_1b_bf16()
    big = llama_70b()
    growth = scaling(options.repeats)
    overhead = timing_overhead(max(options.repeats, 20))
    sharded = sharded_profiling_cost()
    bytes_cost = byte_count_cost(bytes_models, options.repeats)

    table = []
    for row in results:
        t = row["median_s"]
        ms = lambda tool: f"{t[tool] * 1e3:.0f}" if tool in t else "-"  # noqa: E731
        shown = lambda value: f"{value:.2f}" if value is not None else "-"  # noqa: E731
        per_node_us = (t.get("jitflops real", t["jitflops"]) - t["trace"]) / row["nodes"] * 1e6
        engine_us = row["engine_s"] / row["nodes"] * 1e6
        rss = row.get("peak_rss_mib", {})
        row["per_node_overhead_us"] = {"engine_after_trace": engine_us, "all_above_bare_trace": per_node_us}
        table.append([
            row["model"], row["device"], str(row["nodes"]),
            *(ms(tool) for tool in ("forward", "trace", "jitflops", "jitflops real", "dispatch", "export", "FCM fake", *PEERS)),
            *(shown(row["ratios"].get(key)) for key in RATIOS),
            f"{shown(row['ratios'].get('jitflops/fastest peer'))} ({row['ratios'].get('fastest peer', '-')})",
            f"{rss['jitflops']:.0f}/{rss.get('jitflops real', float('nan')):.0f}/{rss.get('FlopCounterMode', float('nan')):.0f}" if rss else "-",
            " / ".join(f"{row['totals'][tool] / 1e9:.3f}" for tool in ("jitflops", "jitflops real", "fvcore", "FlopCounterMode") if tool in row["totals"]),
        ])
    headers = ["model", "device", "nodes", "forward ms", "trace ms", "jitflops ms", "real ms", "dispatch ms", "export ms", "FCM fake ms",
               *(f"{peer} ms" for peer in PEERS), "jf/fwd", "jf/FCM", "real/trace", "jf/fvcore", "dispatch/FCM", "jf/fastest peer",
               "peak RSS MiB jf/real/FCM", "GMACs jf / real / fv / FCM"]
    print(pipe_table(table, headers))
    for row in results:
        for tool, error in row["failed"].items():
            print(f"{row['model']}: {tool} fails: {error}")
    search = search_space_in_fresh_process()
    print_search_space(search)
    fresh = fresh_process(max(options.repeats, 7))
    print_fresh_process(fresh)
    print(f"\nLlama 1.2B shape, real bf16 weights, 4096 tokens: counted in {real_1b['count_s']:.2f} s, "
          f"{real_1b['extra_peak_rss_mib']:.0f} MiB peak RSS over the loaded model ({real_1b['loaded_rss_mib']:.0f} MiB), {real_1b['total_macs'] / 1e12:.2f} TMACs")
    print(f"\nLlama 70B (meta, seq 4096, use_cache=False): built in {big['build_s']:.1f} s, counted in {big['count_s']:.1f} s, "
          f"peak RSS {big['peak_rss_mib']:.0f} MiB, {big['total_macs'] / 1e12:.1f} TMACs ({big['attention_macs'] / 1e12:.1f} T in attention)")
    print(f"Doubling BERT layers 12 -> 24: analysis {growth['layers_12_s'] * 1e3:.0f} ms -> {growth['layers_24_s'] * 1e3:.0f} ms, ratio {growth['ratio']:.2f}")
    print(f"Timed pass on BERT-base (CPU): forward {overhead['without_hooks_s'] * 1e3:.1f} ms without hooks, "
          f"{overhead['with_hooks_s'] * 1e3:.1f} ms with, overhead {100 * overhead['overhead']:.1f}%")
    print(f"FlopsProfiler on one step of {sharded['steps']} (FSDP2 x TP Llama, 4 gloo processes): the profiled step costs "
          f"{sharded['cost_in_steps']:.1f} plain steps more, {100 * sharded['cost']:.1f}% of the schedule (under 5% from {sharded['steps_for_5_percent']:.0f} steps); "
          f"whole runs: {sharded['profiled_s']:.2f} s against {sharded['plain_s']:.2f} s without ({100 * sharded['run_cost']:.1f}%)")
    print()
    print_byte_count_cost(bytes_cost)
    document = {"torch": torch.__version__, "threads": torch.get_num_threads(), "repeats": options.repeats,
                "models": results, "llama_1b_bf16": real_1b, "llama_70b_meta": big, "layer_scaling": growth, "timed_pass_overhead": overhead,
                "sharded_profiling_cost": sharded, "byte_count_cost": bytes_cost, "search_space": search,
                "fresh_process": fresh}
    Path(options.json).write_text(json.dumps(document, indent=2))
    print(f"\nwritten: {options.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
