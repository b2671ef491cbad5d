"""The GPU check, in one command, for a machine with a GPU and no network where torch is installed.

It calibrates the GPU (``jitflops calibrate``) and runs the CUDA tests (``tests/test_cuda.py``: the
counts of CUDA's kernels; the timed pass with CUDA events). For the zoo in bfloat16 and float32, at
batch 1 and 8, it compares the predicted time, on the calibrated spec and on the datasheet's, with
the eager forward without hooks, the prediction without the host's time with the kernels' summed
time (``torch.profiler``), the graph mode's prediction with the forward captured as a CUDA graph
and replayed, the training step's (AdamW) with a steady step, and for the decoders ``generate``'s
prefill and mean decode step (32 tokens from 128) with theirs; it keeps the timed pass per leaf
module and its hooks' overhead.
It compares the memory estimate (inference and an AdamW step; of the model on the CPU with the
GPU's allocator rounding, and of the model on the GPU, on fake CUDA tensors) with
``torch.cuda.max_memory_allocated`` and ``MemTracker`` of the same steady step. It writes one JSON,
after each model, so that a run cut short keeps what it measured.

jitflops' own dependencies are pure Python. On a machine without network, carry them as wheels
from one with it, and install them without dependencies next to the torch already there::

    pip download --no-deps -d wheels tabulate iopath portalocker tqdm pytest iniconfig pluggy packaging
    pip install --no-index --no-deps --target /tmp/site wheels/*.whl && export PYTHONPATH=/tmp/site

    python tools/gpu_check.py                                   # everything; gpu_check.json
    python tools/gpu_check.py --models bert-base --no-tests     # one model, no test run
    python tools/gpu_check.py --tests resnet                    # the CUDA tests whose names hold "resnet"
    python tools/gpu_check.py --device cpu --models transformer --no-tests --batches 1   # the same flow on a CPU
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.utils._pytree import tree_map_only

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

from jitflops import memory_footprint, profile_model  # noqa: E402
from jitflops.estimates.roofline import PredictedTimeAnalysis  # noqa: E402
from jitflops.timing.calibration import calibrate  # noqa: E402
from jitflops.estimates.devices import DeviceSpec, spec_of_gpu  # noqa: E402
from jitflops.estimates.generation_time import predict_generation  # noqa: E402
from jitflops.estimates.training_step_time import predict_training_step  # noqa: E402
from jitflops.examples import all_examples, llama_config  # noqa: E402

MODELS = ["bert-base", "gpt2", "vit-b16", "resnet-50", "mobilenet-v2", "t5-small", "llama-gqa"]
TRANSFORMERS = ("bert-base", "gpt2", "t5-small", "llama-gqa")
"""The zoo's transformers, whose training step is compared."""
DECODERS: dict[str, Callable[[], torch.nn.Module]] = {
    "gpt2": lambda: __import__("transformers").GPT2LMHeadModel(__import__("transformers").GPT2Config()),
    "llama-gqa": lambda: __import__("transformers").LlamaForCausalLM(llama_config(256, 2, 8, 2, 688, vocab=1000)),
}
"""The zoo's decoders with their language-model heads, whose ``generate`` is compared."""
PROMPT, NEW_TOKENS = 128, 32
BATCHES = (1, 8)
"""Batch 1, where an eager forward on a GPU waits on the CPU to launch its kernels, and 8."""
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _cast(value: Any, device: str, dtype: torch.dtype) -> Any:
    """The example's inputs on ``device``, their floating tensors in ``dtype``."""
    return tree_map_only(torch.Tensor, lambda t: t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device), value)


def _batched(value: Any, batch: int) -> Any:
    """The example's inputs (batch 1) repeated to ``batch`` rows."""
    return tree_map_only(torch.Tensor, lambda t: t.expand(batch, *t.shape[1:]).contiguous() if t.dim() and t.shape[0] == 1 else t, value)


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def eager_seconds(model: torch.nn.Module, args: Any, kwargs: Any, device: str, repeats: int) -> float:
    """The median wall time of a forward without hooks, synchronised: what a user of the model waits."""
    samples = []
    with torch.no_grad():
        for _ in range(2 + repeats):
            _synchronize(device)
            start = time.perf_counter()
            model(*args, **kwargs)
            _synchronize(device)
            samples.append(time.perf_counter() - start)
    return statistics.median(samples[2:])


def kernel_seconds(model: torch.nn.Module, args: Any, kwargs: Any, device: str) -> tuple[float, dict[str, list[float]]]:
    """The GPU's busy time in one forward: its kernels' durations summed (``torch.profiler``), the
    time the roofline models without the launches between them (0 on the CPU); and per op, its
    calls, its kernels' seconds and its own host seconds (under the profiler), to tell which family
    a prediction misses."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with torch.no_grad(), profile(activities=activities) as profiler:
        model(*args, **kwargs)
        _synchronize(device)
    # each kernel is a device event and also in its launching op's self device time: the ops' alone
    ops = {event.key: [event.count, event.self_device_time_total / 1e6, event.self_cpu_time_total / 1e6]
           for event in profiler.key_averages() if event.device_type == DeviceType.CPU}
    return sum(event.self_device_time_total for event in profiler.events() if event.device_type == DeviceType.CPU) / 1e6, ops


def _analysis(model: torch.nn.Module, args: Any, kwargs: Any, spec: DeviceSpec, mode: str = "eager") -> PredictedTimeAnalysis:
    return PredictedTimeAnalysis(model, args, kwargs, device=spec, mode=mode).unsupported_ops_warnings(False).uncalled_modules_warnings(False)


def _predicted(model: torch.nn.Module, args: Any, kwargs: Any, spec: DeviceSpec, mode: str = "eager") -> float:
    return _analysis(model, args, kwargs, spec, mode).total()


def graph_seconds(model: torch.nn.Module, args: Any, kwargs: Any, device: str, repeats: int) -> float:
    """The median replay of the forward captured as a CUDA graph, timed by CUDA events: the kernels
    without the host (``mode="graph"``'s prediction)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(3):  # warm-up on a side stream, as torch's docs ask before a capture
            model(*args, **kwargs)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        model(*args, **kwargs)
    samples = []
    for _ in range(2 + repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return statistics.median(samples[2:])


def training_seconds(model: torch.nn.Module, args: Any, kwargs: Any, device: str, steps: int) -> float:
    """The median of ``steps`` steady AdamW steps (torch's default: ``foreach`` on a GPU), synchronised."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters())
    samples = []
    for _ in range(2 + steps):
        _synchronize(device)
        start = time.perf_counter()
        _loss(model(*args, **kwargs)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _synchronize(device)
        samples.append(time.perf_counter() - start)
    model.eval()
    return statistics.median(samples[2:])


def decode_seconds(model: torch.nn.Module, ids: torch.Tensor, device: str, new_tokens: int) -> tuple[float, float]:
    """``generate``'s prefill forward and its mean decode forward, each synchronised and timed by hooks.
    The prompt's mask is given (no padding), as ``predict_generation`` predicts it: without one,
    ``generate`` masks every position holding the pad token (the random prompt's zeros), and
    transformers' attention then takes a padding mask: another path than the one predicted (on a
    CPU, Llama GQA's decode step 200 ops against 168; ``tools/time_accuracy.py`` gives the mask
    since 2026-11-29, this check since 2026-12-06)."""
    times: list[float] = []
    started: list[float] = []

    def before(module: torch.nn.Module, inputs: Any) -> None:
        _synchronize(device)
        started.append(time.perf_counter())

    def after(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        _synchronize(device)
        times.append(time.perf_counter() - started[-1])
    handles = [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
    try:
        runs = []
        for _ in range(3):
            times.clear()
            with torch.no_grad():
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                               pad_token_id=0)
            runs.append((times[0], statistics.mean(times[1:])))
    finally:
        for handle in handles:
            handle.remove()
    return statistics.median(run[0] for run in runs[1:]), statistics.median(run[1] for run in runs[1:])


def compare_steps(name: str, device: str, dtype: torch.dtype, specs: dict[str, DeviceSpec], steps: int, batches: tuple[int, ...] = BATCHES) -> dict[str, Any]:
    """A transformer's AdamW step, and a decoder's ``generate`` (32 tokens from 128), at each of
    ``batches``, against ``predict_training_step`` and ``predict_generation`` on each spec."""
    model, args, kwargs = all_examples()[name].instantiate("cpu")
    model = model.to(device=device, dtype=dtype)
    args, kwargs = _cast(args, device, dtype), _cast(kwargs, device, dtype)
    result: dict[str, Any] = {"model": name, "dtype": str(dtype).removeprefix("torch."), "batches": {}}
    for batch in batches:
        batch_args, batch_kwargs = _batched(args, batch), _batched(kwargs, batch)
        measured = training_seconds(model, batch_args, batch_kwargs, device, steps)
        row: dict[str, Any] = {"training_s": measured, "specs": {}}
        for label, spec in specs.items():
            predicted = predict_training_step(model, batch_args, batch_kwargs, device=spec)
            row["specs"][label] = {"training_predicted_s": predicted.total_s, "training_error": predicted.total_s / measured - 1}
        if name in DECODERS:
            decoder = DECODERS[name]().to(device=device, dtype=dtype).eval()
            ids = torch.randint(0, 1000, (batch, PROMPT), device=device)
            prefill, decode = decode_seconds(decoder, ids, device, NEW_TOKENS)
            row.update(prefill_s=prefill, decode_s=decode)
            for label, spec in specs.items():
                predicted_generation = predict_generation(decoder, ids, NEW_TOKENS, device=spec)
                row["specs"][label].update(prefill_error=predicted_generation.prefill_s / prefill - 1, decode_error=predicted_generation.decode_s / decode - 1)
        result["batches"][str(batch)] = row
    return result


def compare(name: str, device: str, dtype: torch.dtype, specs: dict[str, DeviceSpec], repeats: int, batches: tuple[int, ...] = BATCHES) -> dict[str, Any]:
    """One model's measured forward against each spec's prediction. At batch 1, the profile's timed
    pass per leaf module (CUDA events between hooks) and its hooks' overhead; at each of
    ``batches``, the forward without hooks against the prediction, and the kernels' summed
    time against the prediction without its launch cost."""
    model, args, kwargs = all_examples()[name].instantiate("cpu")
    model = model.to(device=device, dtype=dtype)
    args, kwargs = _cast(args, device, dtype), _cast(kwargs, device, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profiled = profile_model(model, args, kwargs, repeats=repeats, device=specs["calibrated"])
        leaves = [node for node in profiled.root.walk() if not node.children and node.latency is not None and node.predicted_s]
        result: dict[str, Any] = {
            "model": name, "dtype": str(dtype).removeprefix("torch."),
            "timed_s": profiled.summary.forward.median, "hook_overhead": profiled.summary.timing_overhead,
            "modules": {node.name: {"measured_s": node.latency.median, "predicted_s": node.predicted_s} for node in leaves},
            "batches": {},
        }
        for batch in batches:
            batch_args, batch_kwargs = _batched(args, batch), _batched(kwargs, batch)
            kernels_s, measured_ops = kernel_seconds(model, batch_args, batch_kwargs, device)
            kernel_analyses = {label: _analysis(model, batch_args, batch_kwargs, spec.kernels_only()) for label, spec in specs.items()}
            row: dict[str, Any] = {"eager_s": eager_seconds(model, batch_args, batch_kwargs, device, repeats), "kernel_s": kernels_s, "specs": {},
                                   "ops": {"measured": measured_ops, "predicted_kernels": kernel_analyses["calibrated"].by_operator()}}
            if device.startswith("cuda"):
                row["graph_s"] = _guarded(f"{name} graph capture", lambda: graph_seconds(model, batch_args, batch_kwargs, device, repeats))
            for label, spec in specs.items():
                predicted = _predicted(model, batch_args, batch_kwargs, spec)
                kernels = kernel_analyses[label].total()
                row["specs"][label] = {"predicted_s": predicted, "error_vs_eager": predicted / row["eager_s"] - 1,
                                       "kernel_predicted_s": kernels, "error_vs_kernels": kernels / row["kernel_s"] - 1 if row["kernel_s"] else None}
                if isinstance(row.get("graph_s"), float):
                    graph = _predicted(model, batch_args, batch_kwargs, spec, "graph")
                    row["specs"][label].update(graph_predicted_s=graph, error_vs_graph=graph / row["graph_s"] - 1)
            result["batches"][str(batch)] = row
    return result


def _loss(output: Any) -> torch.Tensor:
    """What the estimate differentiates: the output's ``loss``, else the sum of its floating tensors."""
    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    leaves = [t for t in torch.utils._pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return sum(t.float().sum() for t in leaves)


def compare_memory(name: str, device: str, dtype: torch.dtype, spec: Optional[DeviceSpec]) -> list[dict[str, Any]]:
    """The estimate's peak against the measured one of a steady step: inference (no_grad) and AdamW.
    Measured by MemTracker (on any device; it does not see what existed before it started, so the
    model's inputs are added) and, on CUDA, by ``max_memory_allocated`` less what was allocated
    before the model was made (the cuBLAS workspace and the CUDA context's own)."""
    rows = []
    for mode in ("inference", "adamw"):
        cuda = device.startswith("cuda")
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            baseline = torch.cuda.memory_allocated(device)
        model, args, kwargs = all_examples()[name].instantiate("cpu")
        estimate = memory_footprint(model.to(dtype), _cast(args, "cpu", dtype), _cast(kwargs, "cpu", dtype), train=None if mode == "inference" else "adamw", device=spec)
        model = model.to(device=device, dtype=dtype)
        args, kwargs = _cast(args, device, dtype), _cast(kwargs, device, dtype)
        # the same estimate of the model where it runs: its fake tensors on this device take its kernels (SDPA's choice on CUDA)
        try:
            on_device: Any = memory_footprint(model, args, kwargs, train=None if mode == "inference" else "adamw", device=spec).peak
        except Exception as error:  # noqa: BLE001 - recorded in the row
            on_device = f"{type(error).__name__}: {error}"[:500]
        optimizer = torch.optim.AdamW(model.parameters()) if mode == "adamw" else None
        model.train(optimizer is not None)

        def step() -> None:
            with torch.set_grad_enabled(optimizer is not None):
                output = model(*args, **kwargs)
            if optimizer is not None:
                _loss(output).backward()
                del output
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            else:
                del output
        step()  # the optimizer's state, kernels chosen: a steady step next
        inputs = sum(t.untyped_storage().nbytes() for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
        tracker = MemTracker()
        tracker.track_external(*([model, optimizer] if optimizer is not None else [model]))
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        with tracker:
            step()
        row: dict[str, Any] = {"model": name, "dtype": str(dtype).removeprefix("torch."), "mode": mode, "estimate": estimate.peak,
                               "memtracker": next(peak["Total"] for where, peak in tracker.get_tracker_snapshot("peak").items()
                                                  if where.type == torch.device(device).type) + inputs}
        row["error_vs_memtracker"] = estimate.peak / row["memtracker"] - 1
        row["estimate_on_device"] = on_device
        if cuda:
            torch.cuda.synchronize(device)
            row["max_memory_allocated"] = torch.cuda.max_memory_allocated(device) - baseline
            row["error_vs_cuda"] = estimate.peak / row["max_memory_allocated"] - 1
            row["on_device_error_vs_cuda"] = on_device / row["max_memory_allocated"] - 1 if isinstance(on_device, int) else None
        rows.append(row)
        del model, optimizer, args, kwargs, tracker
    return rows


def run_cuda_tests(selection: str) -> dict[str, Any]:
    """The tests that need CUDA, ``tests/test_cuda.py`` and the CUDA cases of the profile's tests,
    whose names match ``selection`` too (pytest's ``-k``)."""
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-k", f"cuda and ({selection})", "tests/test_cuda.py", "tests/test_profile.py", "tests/test_mfu.py"],
                         cwd=REPO, capture_output=True, text=True)
    return {"returncode": run.returncode, "seconds": time.perf_counter() - started, "tail": run.stdout[-6000:] + run.stderr[-2000:]}


def _guarded(label: str, work: Callable[[], Any]) -> Any:
    """``work()``, or a row naming ``label`` and the error: one model's failure costs the others
    nothing on a machine lent for minutes."""
    try:
        return work()
    except Exception as error:  # noqa: BLE001 - recorded in the JSON and printed
        print(f"{label}: {type(error).__name__}: {error}", flush=True)
        return {"failed": label, "error": traceback.format_exc()[-3000:]}


def _model_line(row: dict[str, Any]) -> str:
    parts = [f"{row['model']} {row['dtype']}: timed with hooks {row['timed_s'] * 1e3:.2f} ms (hooks {row['hook_overhead']:+.0%})"]
    for batch, figures in row["batches"].items():
        errors = ", ".join(f"{label} {spec['error_vs_eager']:+.0%}" + (f" (kernels {spec['error_vs_kernels']:+.0%})" if spec["error_vs_kernels"] is not None else "")
                           for label, spec in figures["specs"].items())
        parts.append(f"batch {batch}: eager {figures['eager_s'] * 1e3:.2f} ms, kernels {figures['kernel_s'] * 1e3:.2f} ms, predicted {errors}")
    return "; ".join(parts)


def _memory_line(row: dict[str, Any]) -> str:
    cuda = (f", max_memory_allocated {row['max_memory_allocated']:,} B ({row['error_vs_cuda']:+.2%};"
            f" estimated on the device: {row['on_device_error_vs_cuda']:+.2%})" if row["on_device_error_vs_cuda"] is not None
            else f" estimated on the device: {row['estimate_on_device']})") if "error_vs_cuda" in row else ""
    return f"{row['model']} {row['dtype']} {row['mode']}: estimated {row['estimate']:,} B, MemTracker {row['memtracker']:,} B ({row['error_vs_memtracker']:+.2%}){cuda}"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", nargs="*", default=MODELS, choices=sorted(all_examples()))
    parser.add_argument("--dtypes", nargs="*", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--batches", nargs="*", type=int, default=list(BATCHES), help="the batch sizes timed and predicted (default: 1 8)")
    parser.add_argument("--no-tests", action="store_true", help="skip the CUDA tests")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory estimates")
    parser.add_argument("--no-steps", action="store_true", help="skip the training steps and generation")
    parser.add_argument("--steps", type=int, default=3, help="timed training steps per model, dtype and batch")
    parser.add_argument("--tests", default="cuda", help="run the CUDA tests matching this pytest -k expression (default: all)")
    parser.add_argument("--output", default="gpu_check.json")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    logging.disable(logging.WARNING)
    output = Path(args.output)
    calibrated = calibrate(args.device)
    specs = {"calibrated": calibrated}
    datasheet = spec_of_gpu(torch.cuda.get_device_name(args.device)) if args.device.startswith("cuda") else None
    if datasheet is not None:
        specs["datasheet"] = datasheet
    document: dict[str, Any] = {
        "device": calibrated.name,
        "torch": torch.__version__,
        "calibrated": json.loads(calibrated.to_json()),
        "datasheet": None if datasheet is None else datasheet.name,
        "tests": None,
        "models": [],
        "steps": [],
        "memory": [],
    }
    print(f"calibrated {calibrated.name}: {calibrated.to_json()}", flush=True)
    if not args.no_tests:
        document["tests"] = run_cuda_tests(args.tests)
        output.write_text(json.dumps(document, indent=1))
        print(document["tests"]["tail"][-1500:], flush=True)
    for dtype in args.dtypes:
        for name in args.models:
            row = _guarded(f"{name} {dtype} timing", lambda: compare(name, args.device, DTYPES[dtype], specs, args.repeats, tuple(args.batches)))
            document["models"].append(row)
            output.write_text(json.dumps(document, indent=1))
            if "failed" not in row:
                print(_model_line(row), flush=True)
    for dtype in [] if args.no_steps else args.dtypes:
        for name in [model for model in args.models if model in TRANSFORMERS]:
            row = _guarded(f"{name} {dtype} steps", lambda: compare_steps(name, args.device, DTYPES[dtype], specs, args.steps, tuple(args.batches)))
            document["steps"].append(row)
            output.write_text(json.dumps(document, indent=1))
            print(json.dumps(row)[:600], flush=True)
    for dtype in [] if args.no_memory else args.dtypes:
        for name in args.models:
            rows = _guarded(f"{name} {dtype} memory", lambda: compare_memory(name, args.device, DTYPES[dtype], datasheet))
            document["memory"].extend(rows if isinstance(rows, list) else [rows])
            output.write_text(json.dumps(document, indent=1))
            for row in rows if isinstance(rows, list) else []:
                print(_memory_line(row), flush=True)
    failed = [row["failed"] for row in document["models"] + document["steps"] + document["memory"] if "failed" in row]
    tests_failed = document["tests"] is not None and document["tests"]["returncode"] != 0
    return 1 if failed or tests_failed else 0

if __name__ == "__main__":
    sys.exit(main())
