"""Peak FLOP/s of a device for a dtype: what model FLOPs utilisation (MFU) is measured against.

GPUs: dense (not sparse) tensor-core peaks from the vendors' datasheets, per dtype, as the device
table holds them with their sources (:mod:`jitflops.estimates.devices`). CPUs: a GEMM probe, measured once
per process, dtype and thread count. A user's own figure always wins (``peak_flops=`` in the API,
``--peak-tflops`` on the command line).
"""

from __future__ import annotations

import functools
import time
from typing import Optional

import torch

from ..estimates.devices import spec_of_gpu
from ..core.model_io import ModelCall
from .timed_pass import model_device


def gpu_peak_flops(device_name: str, dtype: torch.dtype) -> Optional[float]:
    """The datasheet's dense peak for a GPU named ``device_name`` (``torch.cuda.get_device_name``);
    float32 on tensor cores (TF32) where torch allows it."""
    spec = spec_of_gpu(device_name)
    return spec.peak_for(dtype, tf32=torch.backends.cuda.matmul.allow_tf32) if spec is not None else None


@functools.lru_cache(maxsize=None)
def cpu_peak_flops(dtype: torch.dtype, threads: int, size: int = 1024, repeats: int = 5, slow_s: float = 0.05) -> float:
    """A GEMM probe: the best FLOP/s of ``repeats`` square matmuls, with ``threads`` threads
    (measured once per process for each dtype and thread count). The products grow from 256 to
    ``size`` while one takes under ``slow_s``: a dtype the CPU emulates (bfloat16 without AVX-512 or
    AMX runs about 70 times slower than float32) is probed on small products in under a second,
    where ``size`` ones took 14 s."""
    edge = 256
    while True:
        a = torch.randn(edge, edge).to(dtype)
        b = torch.randn(edge, edge).to(dtype)
        torch.mm(a, b)  # warm-up: allocations, kernel selection
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
        if edge >= size or best > slow_s:
            return 2 * edge**3 / best
        edge *= 2


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
