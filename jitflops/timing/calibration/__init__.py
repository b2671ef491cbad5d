"""``jitflops calibrate``: what the machine this runs on achieves, op family by op family, as a device spec.

Within one time budget (:mod:`.budget`: 40 s by default, on any machine; ``--budget`` or the
environment's ``JITFLOPS_CALIBRATION_BUDGET_S`` set another), it measures:

- the host's time per eager call by kind (:mod:`.host`) and the bandwidth of a large copy;
- products: a grid of rates by rows and weight size per dtype, the rates one weight size reaches
  by its shape (an inner width half, equal to and twice the square's), and batched products by FLOPs
  on operands just written (:mod:`.products`); a dtype the device only emulates is found, marked
  and timed on small products; on a CPU, the last-level cache's size, and float32's products as a
  decode step of a model that fits it runs them;
- on a CPU, 1 x 1 convolutions on a grid of their own by positions and weight size, per dtype it
  runs at speed, and float32's again with each call right after one of its own;
- dense and depthwise convolutions (:mod:`.convolutions`), grouped ones on a grid by the width of a
  group and FLOPs, per dtype it runs at speed, and fused attention, causal or not, and
  a decode step's one query (:mod:`.attention`), by FLOPs, per dtype it runs at speed;
- elementwise ops by kind (:mod:`.elementwise`), norms, softmax and reductions (:mod:`.reductions`)
  and gathers (:mod:`.gathers`), by elements.

With ``phases`` above one (``--phases N``), everything is measured N times, each a whole calibration
in its share of the budget, and each number is the median of its phases' (:mod:`.phases`): a slow
stretch of a shared machine covers a family's whole timing, and falls on one phase of it at most.

Each family writes its curve into the spec (:class:`~jitflops.estimates.devices.DeviceSpec`'s
``products``, ``kernel_curves`` and ``host_s``), which :mod:`jitflops.estimates.costs` reads; the
spec's peaks and compute curves are the products' best rates and their shares, for the roofline of
the ops no curve covers. ``jitflops calibrate --output spec.json`` saves it; ``--device spec.json``
predicts with it.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Sequence, TypeVar

import torch

from ...estimates.devices import DeviceSpec, dtype_key
from ...estimates.measured_curves import ProductGrid
from ..peak_flops import memory_bandwidth
from .allocator import steady_allocator
from .attention import attention_curves
from .budget import DEFAULT_BUDGET_S, Budget, CallTimer, budget_seconds
from .convolutions import POINTWISE_RESIDENT_RERUNS, convolution_curves, grouped_grid, native_pointwise_grid, pointwise_grid, three_by_three_grid
from .elementwise import elementwise_curves
from .gathers import gather_curve
from .host import host_seconds, per_fresh_page
from .phases import PHASES, derived, median_spec
from .products import (CPU_MOST_FLOPS, CPU_ROWS, CPU_WIDTHS, GPU_ROWS, GPU_WIDTHS, aspect_grid, batched_curve, decode_grid, is_emulated, last_level_cache_bytes,
                       product_grid)
from .reductions import reduction_curves

CALIBRATED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

SHARES = {"products": 0.32, "decode": 0.01, "aspects": 0.03, "batched": 0.06, "convolutions": 0.07, "three_by_three": 0.04, "pointwise": 0.04, "resident_pointwise": 0.03,
          "native_pointwise": 0.01, "grouped": 0.02,
          "attention": 0.08, "elementwise": 0.14, "reductions": 0.10, "gathers": 0.05}
"""Each family's share of the budget, after the host's time per call and the bandwidth are measured (2-4 s)."""


@contextmanager
def _matmul_tf32(allowed: bool) -> Iterator[None]:
    """float32 products on TF32 tensor cores (``allowed``) or not, for the body."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


Measured = TypeVar("Measured")


def _each_dtype(seconds: float, dtypes: Sequence[torch.dtype], measure: Callable[[torch.dtype, Budget], Measured]) -> dict[str, Measured]:
    """``measure(dtype, share)`` of each of ``dtypes`` in turn, by dtype key, sharing ``seconds``:
    each gets an equal part of what those before it left."""
    family = Budget(seconds)
    return {dtype_key(dtype): measure(dtype, Budget(family.left() / (len(dtypes) - index))) for index, dtype in enumerate(dtypes)}


def calibrate(device: str = "cpu", dtypes: Optional[Sequence[torch.dtype]] = None, budget_s: Optional[float] = None,
              name: Optional[str] = None, phases: int = PHASES) -> DeviceSpec:
    """A spec of ``device`` as measured here within ``budget_s`` seconds (default:
    :data:`~.budget.DEFAULT_BUDGET_S`, or the environment's :data:`~.budget.BUDGET_VARIABLE`):
    ``dtypes``' products (float32 and bfloat16; on a GPU also float16 and TF32), and every other
    family in each of them (an emulated dtype's large sizes are not afforded), in ``phases`` phases
    of an equal share of the budget, each number the median of the phases' (:mod:`.phases`). Its
    efficiencies are 1: its rates are what ran."""
    if phases < 1:
        raise ValueError(f"phases must be at least 1, got {phases}")
    budget_s = budget_seconds(budget_s)
    target = torch.device(device)
    dtypes = list(dtypes or (CALIBRATED_DTYPES if target.type == "cuda" else (torch.float32, torch.bfloat16)))
    label = name or (torch.cuda.get_device_name(target) if target.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)")
    steady_allocator()
    spec = median_spec([_phase(target, dtypes, budget_s / phases, label) for _ in range(phases)])
    return dataclasses.replace(spec, source=f"measured by jitflops calibrate on {label}, torch {torch.__version__}, in a {budget_s:.0f} s budget"
                                            + (f", the median of {phases} phases" if phases > 1 else ""))


def _phase(target: torch.device, dtypes: list[torch.dtype], budget_s: float, label: str) -> DeviceSpec:
    """One phase of :func:`calibrate`: every family measured once within ``budget_s``."""
    gpu = target.type == "cuda"
    started = time.perf_counter()
    host = host_seconds(target)
    bandwidth = memory_bandwidth.__wrapped__(str(target), 1024 if gpu else 256)  # timed in each phase, not the process's first reading
    # the families share what the host's and the bandwidth's timings left (2-4 s: DTensor's and
    # FSDP2's imports, an optimizer's first step, FSDP2's hooks among them), and at least half of the budget
    budget = Budget(max(budget_s - (time.perf_counter() - started), budget_s / 2))
    cold, warm, produced = CallTimer(target), CallTimer(target, flush=False), CallTimer(target, flush=False, produce=True)
    on_host = 0.0 if gpu else host["op"]  # a CPU's kernel is timed with its dispatch, which the prediction adds as host time
    rows, widths = (GPU_ROWS, GPU_WIDTHS) if gpu else (CPU_ROWS, CPU_WIDTHS)
    most = float("inf") if gpu else CPU_MOST_FLOPS

    variants = [(dtype, False) for dtype in dtypes] + ([(torch.float32, True)] if gpu and torch.float32 in dtypes else [])
    products_budget = Budget(budget.seconds * SHARES["products"])
    grids: dict[str, ProductGrid] = {}
    emulated: list[str] = []
    for index, (dtype, tf32) in enumerate(variants):
        key = dtype_key(dtype, tf32)
        share = Budget(products_budget.left() / (len(variants) - index))
        float32_best = max(max(line) for line in grids["float32"].rates) if "float32" in grids else 0.0
        with _matmul_tf32(tf32):
            if dtype != torch.float32 and is_emulated(cold, dtype, float32_best):
                emulated.append(key)
                small = [row for row in rows if row <= 32]
                grids[key] = product_grid(cold, dtype, share, small, widths[:2], most)
            else:
                grids[key] = product_grid(cold, dtype, share, rows, widths, most)
    native = [dtype for dtype in dtypes if dtype_key(dtype) not in emulated]
    aspects = _each_dtype(budget.seconds * SHARES["aspects"], native,
                          lambda dtype, share: aspect_grid(cold, dtype, share, rows, widths[len(widths) // 2], most, widening=gpu))
    cache = None if gpu else last_level_cache_bytes()
    decode = decode_grid(Budget(budget.seconds * SHARES["decode"]), widths, cache) if cache and torch.float32 in dtypes else None
    pointwise = {} if gpu else _each_dtype(budget.seconds * SHARES["pointwise"], native, lambda dtype, share: pointwise_grid(produced, dtype, share))
    resident_pointwise = pointwise_grid(CallTimer(target, flush=False, produce=True, reruns=POINTWISE_RESIDENT_RERUNS), torch.float32,
                                        Budget(budget.seconds * SHARES["resident_pointwise"])) if cache and torch.float32 in dtypes else None
    native_pointwise = native_pointwise_grid(produced, Budget(budget.seconds * SHARES["native_pointwise"])) if not gpu and torch.float32 in dtypes else None
    three_by_three = {} if gpu else _each_dtype(budget.seconds * SHARES["three_by_three"], native, lambda dtype, share: three_by_three_grid(produced, dtype, share))
    grouped = _each_dtype(budget.seconds * SHARES["grouped"], native, lambda dtype, share: grouped_grid(produced, dtype, share))
    kernels: dict[str, tuple[tuple[float, float], ...]] = {}
    for family, measure in (("batched", lambda dtype, share: {"bmm": batched_curve(produced, dtype, share, on_host)}),
                            ("convolutions", lambda dtype, share: convolution_curves(cold, produced, dtype, share, on_host)),
                            ("attention", lambda dtype, share: attention_curves(warm, dtype, share, on_host))):
        for key, curves in _each_dtype(budget.seconds * SHARES[family], dtypes, measure).items():  # an emulated dtype's large sizes are not afforded
            kernels.update({f"{kind}.{key}": curve for kind, curve in curves.items() if curve})
    kernels.update(elementwise_curves(produced, Budget(budget.seconds * SHARES["elementwise"]), on_host))
    kernels.update(reduction_curves(produced, Budget(budget.seconds * SHARES["reductions"]), on_host))
    kernels["gather"] = gather_curve(warm, Budget(budget.seconds * SHARES["gathers"]), on_host)
    kernels = {family: curve for family, curve in kernels.items() if curve}
    if "page" in host and (again := per_fresh_page(target)):  # timed again 20-30 s later: the least of both, a stretch of slow faults falls on one at most
        host = {**host, "page": min(host["page"], again["page"])}

    return DeviceSpec(
        name=label,
        memory_bandwidth=bandwidth,
        memory_bytes=torch.cuda.get_device_properties(target).total_memory if gpu else None,
        compute_efficiency=1.0,
        memory_efficiency=1.0,
        products=grids,
        kernel_curves=kernels,
        host_s=host,
        emulated=tuple(emulated),
        cache_bytes=cache,
        threads=None if gpu else torch.get_num_threads(),
        decode_products={"float32": decode} if decode is not None else {},
        pointwise_products=pointwise,
        resident_pointwise_products={"float32": resident_pointwise} if resident_pointwise is not None else {},
        native_pointwise_products={"float32": native_pointwise} if native_pointwise is not None else {},
        product_aspects=aspects,
        grouped_convolutions=grouped,
        three_by_three_convolutions=three_by_three,
        **derived(grids, host),
    )


__all__ = ["CALIBRATED_DTYPES", "DEFAULT_BUDGET_S", "PHASES", "budget_seconds", "calibrate"]
