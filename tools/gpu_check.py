"""The GPU check, in one command, for a machine with a GPU and no network where torch is installed.

It calibrates the GPU (``jitflops calibrate``), runs the CUDA tests (the timed pass with CUDA
events), and for the zoo in bfloat16 and float32 compares the roofline's predicted time, per module
and in total, with the timed pass, on the calibrated spec and on the datasheet's, and the memory
estimate (inference and an AdamW step, on fake tensors with the GPU's allocator rounding) with
``torch.cuda.max_memory_allocated`` and ``MemTracker`` of the same steady step; it writes one JSON.

jitflops' own dependencies are pure Python. On a machine without network, carry them as wheels
from one with it, and install them without dependencies next to the torch already there::

    pip download --no-deps -d wheels tabulate iopath portalocker tqdm pytest iniconfig pluggy packaging
    pip install --no-index --no-deps --target /tmp/site wheels/*.whl && export PYTHONPATH=/tmp/site

    python tools/gpu_check.py                                   # everything; gpu_check.json
    python tools/gpu_check.py --models bert-base --no-tests     # one model, no test run
    python tools/gpu_check.py --device cpu --models transformer --no-tests   # the same flow on a CPU
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Optional

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

from jitflops import memory_footprint, profile_model  # noqa: E402
from jitflops.timing.calibration import calibrate  # noqa: E402
from jitflops.estimates.devices import DeviceSpec, spec_of_gpu  # noqa: E402
from jitflops.examples import all_examples  # noqa: E402

MODELS = ["bert-base", "gpt2", "vit-b16", "resnet-50", "mobilenet-v2", "t5-small", "llama-gqa"]
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _cast(value: Any, device: str, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype) if value.is_floating_point() else value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(item, device, dtype) for item in value)
    if isinstance(value, dict):
        return {key: _cast(item, device, dtype) for key, item in value.items()}
    return value


def compare(name: str, device: str, dtype: torch.dtype, specs: dict[str, DeviceSpec], repeats: int) -> dict[str, Any]:
    """One model's measured forward against each spec's prediction, in total and per leaf module."""
    model, args, kwargs = all_examples()[name].instantiate("cpu")
    model = model.to(device=device, dtype=dtype)
    args, kwargs = _cast(args, device, dtype), _cast(kwargs, device, dtype)
    result: dict[str, Any] = {"model": name, "dtype": str(dtype).removeprefix("torch."), "specs": {}}
    for label, spec in specs.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            profile = profile_model(model, args, kwargs, repeats=repeats, device=spec)
        leaves = [node for node in profile.root.walk() if not node.children and node.latency is not None and node.predicted_s]
        result["measured_s"] = profile.summary.forward.median
        result["specs"][label] = {
            "predicted_s": profile.summary.predicted_s,
            "error": profile.summary.predicted_to_measured - 1,
            "bound": profile.summary.bound,
            "modules": {node.name: {"measured_s": node.latency.median, "predicted_s": node.predicted_s} for node in leaves},
        }
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
        if cuda:
            torch.cuda.synchronize(device)
            row["max_memory_allocated"] = torch.cuda.max_memory_allocated(device) - baseline
            row["error_vs_cuda"] = estimate.peak / row["max_memory_allocated"] - 1
        rows.append(row)
        del model, optimizer, args, kwargs, tracker
    return rows


def run_cuda_tests() -> dict[str, Any]:
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-k", "cuda", "tests/test_profile.py", "tests/test_mfu.py"],
                         cwd=REPO, capture_output=True, text=True)
    return {"returncode": run.returncode, "seconds": time.perf_counter() - started, "tail": run.stdout[-2000:] + run.stderr[-2000:]}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", nargs="*", default=MODELS, choices=sorted(all_examples()))
    parser.add_argument("--dtypes", nargs="*", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-tests", action="store_true", help="skip the CUDA tests")
    parser.add_argument("--output", default="gpu_check.json")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    logging.disable(logging.WARNING)
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
        "tests": None if args.no_tests else run_cuda_tests(),
        "models": [compare(name, args.device, DTYPES[dtype], specs, args.repeats) for dtype in args.dtypes for name in args.models],
        "memory": [row for dtype in args.dtypes for name in args.models for row in compare_memory(name, args.device, DTYPES[dtype], datasheet)],
    }
    Path(args.output).write_text(json.dumps(document, indent=1))
    for row in document["models"]:
        errors = ", ".join(f"{label} {figures['error']:+.0%}" for label, figures in row["specs"].items())
        print(f"{row['model']} {row['dtype']}: measured {row['measured_s'] * 1e3:.2f} ms, predicted: {errors}")
    for row in document["memory"]:
        cuda = f", max_memory_allocated {row['max_memory_allocated']:,} B ({row['error_vs_cuda']:+.2%})" if "error_vs_cuda" in row else ""
        print(f"{row['model']} {row['dtype']} {row['mode']}: estimated {row['estimate']:,} B, MemTracker {row['memtracker']:,} B ({row['error_vs_memtracker']:+.2%}){cuda}")
    return 0 if document["tests"] is None or document["tests"]["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
