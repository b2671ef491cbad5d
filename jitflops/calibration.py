"""Calibration: what the machine this runs on achieves, as a device spec for the roofline.

``calibrate()`` measures, on the CPU or a GPU, the median FLOP/s of square matmuls per dtype on
weights that come from memory, the bandwidth of a large copy (read plus write), and the time of one tiny op (a kernel's launch, or an
eager op's dispatch on the CPU). Its spec's efficiencies are 1: its peaks are what ran. ``jitflops
calibrate --output spec.json`` saves it; ``--device spec.json`` predicts with it.
"""

from __future__ import annotations

import statistics
import time
from typing import Optional, Sequence

import torch

from .devices import DeviceSpec, dtype_key
from .peak_flops import memory_bandwidth

CALIBRATED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_flops(device: torch.device, dtype: torch.dtype, size: int, operands: int = 8) -> float:
    """The median FLOP/s of square ``size`` matmuls in ``dtype`` on ``device``, each with another
    of ``operands`` right-hand matrices, twice round: a model's weights come from memory, not from
    a cache the previous call warmed (the best of a warm repeat overstates what a layer reaches)."""
    a = torch.randn(size, size, device=device).to(dtype)
    weights = [torch.randn(size, size, device=device).to(dtype) for _ in range(operands)]
    torch.mm(a, weights[0])
    samples = []
    for b in weights * 2:
        _synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        _synchronize(device)
        samples.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(samples)


def launch_seconds(device: torch.device, repeats: int = 2000) -> float:
    """The median time of one tiny op (an add of two 1-element tensors): what every kernel costs
    before its work, timed over ``repeats`` calls in a row."""
    a, b = torch.ones(1, device=device), torch.ones(1, device=device)
    for _ in range(100):
        torch.add(a, b)
    samples = []
    for _ in range(5):
        _synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            torch.add(a, b)
        _synchronize(device)
        samples.append((time.perf_counter() - start) / repeats)
    return statistics.median(samples)


def calibrate(device: str = "cpu", dtypes: Optional[Sequence[torch.dtype]] = None, size: Optional[int] = None, name: Optional[str] = None) -> DeviceSpec:
    """A spec of ``device`` as measured here: matmul FLOP/s per dtype (float32, bfloat16 and on a
    GPU float16; matrices of ``size``: 1024 on a CPU, 8192 on a GPU), copy bandwidth and launch
    time; efficiencies 1. (A CPU's float16 matmuls run without vector units, a thousand times
    slower: a float16 model on a CPU is predicted at its bfloat16 peak.)"""
    target = torch.device(device)
    dtypes = dtypes or (CALIBRATED_DTYPES if target.type == "cuda" else (torch.float32, torch.bfloat16))
    size = size or (8192 if target.type == "cuda" else 1024)
    peaks = {}
    for dtype in dtypes:
        try:
            peaks[dtype_key(dtype)] = matmul_flops(target, dtype, size)
        except RuntimeError:  # no matmul for this dtype here
            continue
    label = name or (torch.cuda.get_device_name(target) if target.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)")
    return DeviceSpec(
        name=label,
        peak_flops=peaks,
        memory_bandwidth=memory_bandwidth(str(target), 1024 if target.type == "cuda" else 256),
        memory_bytes=torch.cuda.get_device_properties(target).total_memory if target.type == "cuda" else None,
        compute_efficiency=1.0,
        memory_efficiency=1.0,
        launch_s=launch_seconds(target),
        source=f"measured by jitflops calibrate on {label}, torch {torch.__version__}",
    )
