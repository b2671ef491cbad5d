"""Peak FLOP/s of a device for a dtype: what model FLOPs utilisation (MFU) is measured against.

GPUs: dense (not sparse) tensor-core peaks from the vendors' datasheets, per dtype. CPUs: a GEMM
probe, measured once per process, dtype and thread count. A user's own figure always wins
(``peak_flops=`` in the API, ``--peak-tflops`` on the command line).

Sources (FLOP/s without structured sparsity; where a datasheet gives only the sparse figure, half
of it):

* NVIDIA H100 / H200: "NVIDIA H100 Tensor Core GPU" datasheet (SXM5, PCIe, NVL columns) and
  "NVIDIA H200 Tensor Core GPU" datasheet;
* NVIDIA B200: "NVIDIA DGX B200" datasheet, per GPU (DGX totals / 8);
* NVIDIA A100: "NVIDIA A100 Tensor Core GPU" datasheet (the same figures for 40 and 80 GB, SXM and PCIe);
* NVIDIA L40S, L4, A10, A6000, RTX 6000 Ada, V100: their product datasheets;
* AMD Instinct MI300X, MI300A, MI325X, MI250X: AMD's product pages ("Peak ... Performance", matrix).
"""

from __future__ import annotations

import functools
import time
from typing import Optional

import torch

from .model_io import ModelCall
from .timing import model_device

TERA = 1e12

# name fragment (matched in order, most specific first) -> dtype -> dense peak TFLOP/s.
# "tf32" is the figure for float32 matmuls on tensor cores, used when torch allows TF32.
GPU_PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 NVL", {"float64": 60.0, "float32": 60.0, "tf32": 417.5, "bfloat16": 835.5, "float16": 835.5, "float8": 1671.0}),
    ("H100 PCIe", {"float64": 51.0, "float32": 51.0, "tf32": 378.0, "bfloat16": 756.0, "float16": 756.0, "float8": 1513.0}),
    ("H100", {"float64": 67.0, "float32": 67.0, "tf32": 494.5, "bfloat16": 989.5, "float16": 989.5, "float8": 1979.0}),
    ("H200", {"float64": 67.0, "float32": 67.0, "tf32": 494.5, "bfloat16": 989.5, "float16": 989.5, "float8": 1979.0}),
    ("GH200", {"float64": 67.0, "float32": 67.0, "tf32": 494.5, "bfloat16": 989.5, "float16": 989.5, "float8": 1979.0}),
    ("B200", {"float64": 40.0, "float32": 80.0, "tf32": 1100.0, "bfloat16": 2250.0, "float16": 2250.0, "float8": 4500.0}),
    ("A100", {"float64": 19.5, "float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0}),
    ("L40S", {"float32": 91.6, "tf32": 183.0, "bfloat16": 362.05, "float16": 362.05, "float8": 733.0}),
    ("L4", {"float32": 30.3, "tf32": 60.0, "bfloat16": 121.0, "float16": 121.0, "float8": 242.5}),
    ("A10", {"float32": 31.2, "tf32": 62.5, "bfloat16": 125.0, "float16": 125.0}),
    ("RTX 6000 Ada", {"float32": 91.1, "tf32": 182.1, "bfloat16": 364.2, "float16": 364.2, "float8": 728.5}),
    ("A6000", {"float32": 38.7, "tf32": 77.4, "bfloat16": 154.8, "float16": 154.8}),
    ("V100", {"float64": 7.8, "float32": 15.7, "float16": 125.0}),
    ("MI325X", {"float64": 163.4, "float32": 163.4, "tf32": 653.7, "bfloat16": 1307.4, "float16": 1307.4, "float8": 2614.9}),
    ("MI300X", {"float64": 163.4, "float32": 163.4, "tf32": 653.7, "bfloat16": 1307.4, "float16": 1307.4, "float8": 2614.9}),
    ("MI300A", {"float64": 122.6, "float32": 122.6, "tf32": 490.3, "bfloat16": 980.6, "float16": 980.6, "float8": 1961.2}),
    ("MI250X", {"float64": 95.7, "float32": 95.7, "bfloat16": 383.0, "float16": 383.0}),
)

_FLOAT8 = {getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, name)}


def _dtype_key(dtype: torch.dtype) -> str:
    if dtype in _FLOAT8:
        return "float8"
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return str(dtype).removeprefix("torch.")


def gpu_peak_flops(device_name: str, dtype: torch.dtype) -> Optional[float]:
    """The datasheet's dense peak for a GPU named ``device_name`` (``torch.cuda.get_device_name``)."""
    for fragment, peaks in GPU_PEAK_TFLOPS:
        if fragment.lower() in device_name.lower():
            peak = peaks.get(_dtype_key(dtype))
            return peak * TERA if peak is not None else None
    return None


@functools.lru_cache(maxsize=None)
def cpu_peak_flops(dtype: torch.dtype, threads: int, size: int = 1024, repeats: int = 5) -> float:
    """A GEMM probe: the best FLOP/s of ``repeats`` square matmuls of ``size``, with ``threads``
    threads (measured once per process for each dtype and thread count)."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)  # warm-up: allocations, kernel selection
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def peak_flops(device: torch.device, dtype: torch.dtype) -> Optional[float]:
    """Peak FLOP/s of ``device`` for ``dtype``: the datasheet for a known GPU, the GEMM probe for a
    CPU, None where unknown (MFU is then not reported)."""
    if device.type == "cuda":
        return gpu_peak_flops(torch.cuda.get_device_name(device), dtype)
    if device.type == "cpu" and dtype.is_floating_point:
        return cpu_peak_flops(dtype, torch.get_num_threads())
    return None


def model_peak_flops(model: torch.nn.Module, call: ModelCall) -> Optional[float]:
    """Peak FLOP/s for where and in what the model computes: its device, and the dtype of its
    first floating-point parameter (else input)."""
    floating = [t for t in [*model.parameters(), *call.tensors()] if t.dtype.is_floating_point]
    return peak_flops(model_device(model, call), floating[0].dtype) if floating else None


@functools.lru_cache(maxsize=None)
def memory_bandwidth(device: str, megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second a copy of ``megabytes`` moves on ``device`` (read plus write), the best
    of ``repeats``: the slanted roof of the roofline, measured once per process and device."""
    target = torch.device(device)
    source = torch.empty(megabytes * 2**20 // 4, dtype=torch.float32, device=target)
    destination = torch.empty_like(source)
    destination.copy_(source)
    best = float("inf")
    for _ in range(repeats):
        if target.type == "cuda":
            torch.cuda.synchronize(target)
        start = time.perf_counter()
        destination.copy_(source)
        if target.type == "cuda":
            torch.cuda.synchronize(target)
        best = min(best, time.perf_counter() - start)
    return 2 * source.numel() * source.element_size() / best
