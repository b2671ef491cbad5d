"""Calibration: what the machine this runs on achieves, as a device spec for the roofline.

``calibrate()`` measures, on the CPU or a GPU, the median FLOP/s per dtype of a grid of matmul
shapes (:data:`CPU_SHAPES`, :data:`GPU_SHAPES`: rows of a batch of tokens against a layer's
weights) on weights that come from memory, with the caches flushed between calls as a model's
other ops flush them: the best is the peak, and the shares of it by product size that dtype's
compute curve (small products reach less, and a small bfloat16 product on a GPU a smaller share
than a float32 one); on a GPU also float32 on TF32 tensor cores; the bandwidth of a large copy
(read plus write); and the time of one tiny op (a kernel's launch, or an eager op's dispatch on
the CPU). Its spec's efficiencies are 1: its peaks
are what ran. ``jitflops calibrate --output spec.json`` saves it; ``--device spec.json`` predicts
with it.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Sequence

import torch

from ..estimates.devices import DeviceSpec, dtype_key
from .peak_flops import memory_bandwidth

CALIBRATED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

CPU_SHAPES = tuple((rows, size, size) for rows in (32, 128, 512, 2048) for size in (256, 1024, 2048))
GPU_SHAPES = tuple((rows, size, size) for rows in (128, 1024, 8192) for size in (1024, 4096, 8192))
"""(M, K, N) of the matmuls calibrated: M rows (tokens, or batch x positions) by K x N weights,
from small products to large: their rates make the spec's compute curve."""


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rates(device: torch.device, dtype: torch.dtype, shapes: Sequence[tuple[int, int, int]], operands: int = 4) -> list[tuple[float, float]]:
    """Per shape of ``shapes``, its FLOPs and the median FLOP/s of its matmuls in ``dtype`` on
    ``device``, against ``operands`` right-hand matrices twice round, a write over a buffer larger
    than the caches before each: a model's weights come from memory, not from a cache the previous
    call warmed (a warm repeat overstates what a layer reaches). On a GPU each product is timed
    alone by CUDA events around its kernel, the GPU kept busy by the write before it: a host clock
    and a synchronisation per product would add their own microseconds to the small ones."""
    flush = torch.empty(256 * 2**20 if device.type == "cuda" else 64 * 2**20, dtype=torch.uint8, device=device)
    measured = []
    for rows, inner, columns in shapes:
        a = torch.randn(rows, inner, device=device).to(dtype)
        weights = [torch.randn(inner, columns, device=device).to(dtype) for _ in range(operands)]
        torch.mm(a, weights[0])
        seconds = [_seconds_of(device, flush, lambda: torch.mm(a, b)) for b in weights * 2]
        flops = 2.0 * rows * inner * columns
        measured.append((flops, flops / statistics.median(seconds)))
    return sorted(measured)


def _seconds_of(device: torch.device, flush: torch.Tensor, run: Callable[[], object]) -> float:
    """The time of ``run()`` after a write over ``flush``: CUDA events around it on a GPU, the host
    clock on the CPU (whose op returns when it is done)."""
    flush.fill_(1)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def _monotone_shares(rates: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """The shares of the best rate by FLOPs, one point per size, made non-decreasing (a larger
    product reaching less than a smaller one is the machine's noise, not a property to predict)."""
    best = max(rate for _, rate in rates)
    points: list[tuple[float, float]] = []
    for flops, rate in rates:
        share = max(rate / best, points[-1][1] if points else 0.0)
        if points and points[-1][0] == flops:
            points[-1] = (flops, max(points[-1][1], share))
        else:
            points.append((flops, share))
    return tuple(points)


@contextmanager
def _matmul_tf32(allowed: bool) -> Iterator[None]:
    """float32 products on TF32 tensor cores (``allowed``) or not, for the body."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


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


def calibrate(device: str = "cpu", dtypes: Optional[Sequence[torch.dtype]] = None, shapes: Optional[Sequence[tuple[int, int, int]]] = None,
              name: Optional[str] = None) -> DeviceSpec:
    """A spec of ``device`` as measured here: matmul FLOP/s per dtype (float32, bfloat16 and on a
    GPU float16 and TF32) over ``shapes`` (:data:`CPU_SHAPES` or :data:`GPU_SHAPES`), copy bandwidth and
    launch time; efficiencies 1. (A CPU's float16 matmuls run without vector units, a thousand
    times slower: a float16 model on a CPU is predicted at its bfloat16 peak.)"""
    target = torch.device(device)
    dtypes = dtypes or (CALIBRATED_DTYPES if target.type == "cuda" else (torch.float32, torch.bfloat16))
    shapes = shapes or (GPU_SHAPES if target.type == "cuda" else CPU_SHAPES)
    peaks: dict[str, float] = {}
    curves: dict[str, tuple[tuple[float, float], ...]] = {}
    for dtype, tf32 in [(dtype, False) for dtype in dtypes] + ([(torch.float32, True)] if target.type == "cuda" and torch.float32 in dtypes else []):
        try:
            with _matmul_tf32(tf32):
                rates = matmul_rates(target, dtype, shapes)
        except RuntimeError:  # no matmul for this dtype here
            continue
        key = dtype_key(dtype, tf32)
        peaks[key] = max(rate for _, rate in rates)
        curves[key] = _monotone_shares(rates)
    label = name or (torch.cuda.get_device_name(target) if target.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)")
    return DeviceSpec(
        name=label,
        peak_flops=peaks,
        memory_bandwidth=memory_bandwidth(str(target), 1024 if target.type == "cuda" else 256),
        memory_bytes=torch.cuda.get_device_properties(target).total_memory if target.type == "cuda" else None,
        compute_efficiency=1.0,
        compute_curve=curves.get(dtype_key(dtypes[0]), ()),
        dtype_curves=curves,
        memory_efficiency=1.0,
        launch_s=launch_seconds(target),
        source=f"measured by jitflops calibrate on {label}, torch {torch.__version__}",
    )
