"""Benchmark: what jitflops costs next to the trace it needs, fvcore and FlopCounterMode.

For each model of the zoo, interleaved over several repetitions (medians reported):

* ``trace``: bare ``torch.jit._get_trace_graph`` of the model, no hooks (the floor);
* ``jitflops``: ``FlopCountAnalysis(...).total()`` from a fresh object;
* ``jitflops+reports``: that, then ``by_module()``, ``by_operator()`` and ``flop_count_table()``;
* ``fvcore``: fvcore's ``FlopCountAnalysis(...).total()`` (wrapped as fvcore needs);
* ``FlopCounterMode``: ``torch.utils.flop_counter`` on the same forward.

Peak memory (RSS) of each tool is measured in a fresh subprocess per model and tool. Then the
scale checks: the 70B Llama configuration on the meta device (time, peak RSS), the growth of the
analysis time when the layer count doubles, and the timing overhead of the profile's timed pass
on BERT-base. Prints one table and writes the same figures as JSON.

    python tools/bench.py                   # everything (a few minutes on 2 cores)
    python tools/bench.py --models bert-base resnet-50 --repeats 3 --json /tmp/bench.json
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jitflops import FlopCountAnalysis, flop_count_table  # noqa: E402
from jitflops.examples import ZOO  # noqa: E402
from jitflops.model_io import FlatCall, ModelCall, tensor_leaves  # noqa: E402
from jitflops.table import pipe_table  # noqa: E402

DEFAULT_MODELS = [name for name, example in ZOO.items() if "zoo" in example.tags] + ["bert-large", "llama-8b"]
TOOLS = ("trace", "jitflops", "jitflops+reports", "fvcore", "FlopCounterMode")


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
    from torch.utils.flop_counter import FlopCounterMode

    call = ModelCall(args, kwargs)

    def bare_trace() -> float:
        runner = FlatCall(model, call)
        with torch.no_grad():
            torch.jit._get_trace_graph(runner, runner.flat_inputs())
        return float("nan")

    def jitflops_total() -> float:
        return FlopCountAnalysis(model, args, kwargs).unsupported_ops_warnings(False).uncalled_modules_warnings(False).total()

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

    def flop_counter_mode() -> float:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(*args, **kwargs)
        return counter.get_total_flops() / 2  # it counts a multiply-add as 2

    return {"trace": bare_trace, "jitflops": jitflops_total, "jitflops+reports": jitflops_reports, "fvcore": fvcore_total, "FlopCounterMode": flop_counter_mode}


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


def time_tools(name: str, repeats: int, tools: tuple[str, ...]) -> dict[str, Any]:
    model, args, kwargs = ZOO[name].instantiate(device_for(name))
    runners = make_runners(model, args, kwargs)
    if device_for(name) == "meta":  # fvcore's handles and FlopCounterMode cannot run on meta tensors here
        tools = tuple(t for t in tools if t in ("trace", "jitflops", "jitflops+reports"))
    seconds: dict[str, list[float]] = {tool: [] for tool in tools}
    totals: dict[str, float] = {}
    for tool in tools:  # one untimed run each: imports, caches
        totals[tool] = runners[tool]()
    for _ in range(repeats):
        for tool in tools:
            gc.collect()
            start = time.perf_counter()
            runners[tool]()
            seconds[tool].append(time.perf_counter() - start)
    nodes, engine_s = engine_cost(model, args, kwargs, repeats)
    return {
        "model": name,
        "device": device_for(name),
        "nodes": nodes,
        "engine_s": engine_s,
        "median_s": {tool: statistics.median(values) for tool, values in seconds.items()},
        "totals": {tool: totals[tool] for tool in tools if tool != "trace"},
    }


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


def llama_70b() -> dict[str, float]:
    """Count the 70B configuration on meta in a fresh process: seconds and peak RSS."""
    code = (
        "import time, logging; logging.disable(logging.WARNING);"
        "from jitflops import FlopCountAnalysis; from jitflops.examples import ZOO;"
        "start = time.perf_counter(); m, a, k = ZOO['llama-70b'].instantiate('meta'); built = time.perf_counter();"
        "f = FlopCountAnalysis(m, a, k); total = f.total(); done = time.perf_counter();"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=DEFAULT_MODELS, choices=sorted(ZOO))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-memory", action="store_true", help="skip the per-tool peak RSS subprocesses")
    parser.add_argument("--json", default=str(REPO / "tools" / "bench_results.json"))
    options = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    results = []
    for name in options.models:
        row = time_tools(name, options.repeats, TOOLS)
        if not options.no_memory:
            row["peak_rss_mib"] = {tool: peak_rss_mib(name, tool) for tool in row["median_s"]}
        results.append(row)
        print(f"measured {name}", file=sys.stderr, flush=True)
    big = llama_70b()
    growth = scaling(options.repeats)
    overhead = timing_overhead(max(options.repeats, 20))

    table = []
    for row in results:
        t = row["median_s"]
        per_node_us = (t["jitflops"] - t["trace"]) / row["nodes"] * 1e6
        engine_us = row["engine_s"] / row["nodes"] * 1e6
        fv = t.get("fvcore")
        fcm = t.get("FlopCounterMode")
        rss = row.get("peak_rss_mib", {})
        table.append([
            row["model"], row["device"], str(row["nodes"]),
            f"{t['trace'] * 1e3:.0f}", f"{t['jitflops'] * 1e3:.0f}", f"{t['jitflops+reports'] * 1e3:.0f}",
            f"{fv * 1e3:.0f}" if fv else "-", f"{fcm * 1e3:.0f}" if fcm else "-",
            f"{t['jitflops'] / t['trace']:.2f}", f"{t['jitflops'] / fv:.2f}" if fv else "-", f"{t['jitflops'] / fcm:.2f}" if fcm else "-",
            f"{engine_us:.1f} / {per_node_us:.1f}",
            f"{rss['jitflops']:.0f}/{rss.get('fvcore', float('nan')):.0f}/{rss.get('FlopCounterMode', float('nan')):.0f}" if rss else "-",
            " / ".join(f"{row['totals'][tool] / 1e9:.3f}" for tool in ("jitflops", "fvcore", "FlopCounterMode") if tool in row["totals"]),
        ])
        row["ratios"] = {"jitflops/trace": t["jitflops"] / t["trace"], "jitflops/fvcore": t["jitflops"] / fv if fv else None, "jitflops/FlopCounterMode": t["jitflops"] / fcm if fcm else None}
        row["per_node_overhead_us"] = {"engine_after_trace": engine_us, "all_above_bare_trace": per_node_us}
    headers = ["model", "device", "nodes", "trace ms", "jitflops ms", "+reports ms", "fvcore ms", "FCM ms",
               "jf/trace", "jf/fvcore", "jf/FCM", "us/node engine / all", "peak RSS MiB jf/fv/FCM", "GMACs jf / fv / FCM"]
    print(pipe_table(table, headers))
    print(f"\nLlama 70B (meta, seq 4096): built in {big['build_s']:.1f} s, counted in {big['count_s']:.1f} s, "
          f"peak RSS {big['peak_rss_mib']:.0f} MiB, {big['total_macs'] / 1e12:.1f} TMACs ({big['attention_macs'] / 1e12:.1f} T in attention)")
    print(f"Doubling BERT layers 12 -> 24: analysis {growth['layers_12_s'] * 1e3:.0f} ms -> {growth['layers_24_s'] * 1e3:.0f} ms, ratio {growth['ratio']:.2f}")
    print(f"Timed pass on BERT-base (CPU): forward {overhead['without_hooks_s'] * 1e3:.1f} ms without hooks, "
          f"{overhead['with_hooks_s'] * 1e3:.1f} ms with, overhead {100 * overhead['overhead']:.1f}%")
    document = {"torch": torch.__version__, "threads": torch.get_num_threads(), "repeats": options.repeats,
                "models": results, "llama_70b_meta": big, "layer_scaling": growth, "timed_pass_overhead": overhead}
    Path(options.json).write_text(json.dumps(document, indent=2))
    print(f"\nwritten: {options.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
