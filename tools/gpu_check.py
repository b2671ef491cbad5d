"""The GPU check, in one command, for a machine with a GPU and no network where torch is installed.

It calibrates the GPU (``jitflops calibrate``), runs the CUDA tests (the timed pass with CUDA
events), and for the zoo in bfloat16 and float32 compares the roofline's predicted time, per module
and in total, with the timed pass, on the calibrated spec and on the datasheet's; it writes one JSON.

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

from jitflops import profile_model  # noqa: E402
from jitflops.calibration import calibrate  # noqa: E402
from jitflops.devices import DeviceSpec, spec_of_gpu  # noqa: E402
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
    }
    Path(args.output).write_text(json.dumps(document, indent=1))
    for row in document["models"]:
        errors = ", ".join(f"{label} {figures['error']:+.0%}" for label, figures in row["specs"].items())
        print(f"{row['model']} {row['dtype']}: measured {row['measured_s'] * 1e3:.2f} ms, predicted: {errors}")
    return 0 if document["tests"] is None or document["tests"]["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
