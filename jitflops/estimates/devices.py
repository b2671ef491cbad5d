"""Devices as a roofline sees them: dense peak FLOP/s per dtype, memory bandwidth, memory size.

:data:`DEVICES` holds datasheet figures (dense: without structured sparsity; where a datasheet gives
only the sparse figure, half of it), each with its source. A :class:`DeviceSpec` can also come from
a JSON file, written by ``jitflops calibrate`` (measured on the machine it ran on) or by hand.

What a datasheet peak leaves out, the efficiencies put in: the share of the peak FLOP/s and of the
bandwidth that kernels reach, and a fixed cost per kernel launch. A datasheet device uses the
defaults below, which are typical achieved shares, not measurements of this package (cuBLAS's large
bf16 GEMMs reach 70-80% of an H100's dense peak; copies 80-90% of its HBM bandwidth; a CUDA launch
costs a few microseconds). A calibrated spec carries what was measured (its efficiencies are 1: its
peaks are already what ran).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch

from .measured_curves import Curve, ProductGrid

TERA = 1e12

LIBRARY_CALLS = ("product", "convolution", "batch_norm", "attention")
"""Ops whose eager call on a GPU asks a library to plan it (cuBLAS's products, cuDNN's convolutions
and batch norms, the fused attention kernels): calibrated on a GPU apart from a plain op, whose
host time they take where a spec has none of theirs. On an H200 under ``torch.profiler`` (torch
2.11), ``addmm`` took 29 us of its own, ``cudnn_convolution`` 49 and ``cudnn_batch_norm`` 25,
against ``add``'s 10."""

HOST_KINDS = ("op", "view", "scalar", "module", "bytecode", "backward", "dtensor", "parallel_dtensor", "fsdp_unit", "fsdp_tensor", "page", *LIBRARY_CALLS)
"""What an eager step spends host time on: a call that dispatches a kernel, a view or other
metadata-only op, a read of a size or scalar, an ``nn.Module`` call, a bytecode instruction of the
model's own Python between its ops (:mod:`~jitflops.frontends.bytecode_count`; a spec without it
prices none), the autograd engine's call of a backward op (no Python), and DTensor's dispatch of an op on top of the op it runs on this
rank's shard (its sharding propagation, unwrapping the shards, wrapping the result): tensor
parallelism's and FSDP2's parameters are DTensors. ``parallel_dtensor`` is that of an op in a module
tensor parallelism sharded, its parallel style's conversions (``from_local``, ``redistribute``,
``to_local``, forward and backward) shared out over its ops. ``fsdp_unit`` and ``fsdp_tensor`` are
FSDP2's hooks in a forward and backward, per unit it shards and per parameter tensor (the plan's,
on a CPU). ``page`` is the OS's time faulting in a page of an output mapped afresh, on a CPU
(:mod:`~jitflops.estimates.costs.fresh_pages`): added to the op's kernel, and none where a spec
has none of it."""

GRIDS = ("products", "decode_products", "pointwise_products", "resident_pointwise_products", "native_pointwise_products", "product_aspects", "grouped_convolutions",
         "three_by_three_convolutions")
"""A spec's fields of measured grids (:class:`ProductGrid` per dtype key): validated, scaled by
:meth:`DeviceSpec.time_shared` and read from a spec file alike."""

RESIDENT_SHARE = 0.5
"""The share of the last-level cache a model's weights may take and still have its 1 x 1
convolutions read from the grid timed in the cache (:meth:`DeviceSpec.for_weights`), and its
decode steps' products from the decode grid (:meth:`DeviceSpec.for_decode`)."""

RETIRED_KEYS = frozenset({"resident_products"})
"""Keys of spec files written by earlier releases that no field reads any more, dropped on reading
(``resident_products``, products timed in passes over weights in the last-level cache, with no
work between them, for every call of a model whose weights fit it: a forward does not find its
weights there, and a decode step's products take longer with its other ops between them,
:attr:`DeviceSpec.decode_products`; until 2026-12-06)."""

DTYPE_KEYS = ("float64", "float32", "tf32", "bfloat16", "float16", "float8", "int8")
"""The keys of a spec's peaks: torch's dtype names, ``tf32`` for float32 matmuls on tensor cores,
``float8`` for every 8-bit float."""

_FLOAT8 = {getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, name)}


class DeviceSpecError(ValueError):
    """A device name that names no known device, or a spec that cannot be used: the message says why."""


@dataclass(frozen=True)
class DeviceSpec:
    """What a roofline needs of a device. ``peak_flops`` maps :data:`DTYPE_KEYS` to dense FLOP/s."""

    name: str
    peak_flops: Mapping[str, float]
    memory_bandwidth: float
    """Bytes per second."""
    memory_bytes: Optional[int] = None
    compute_efficiency: float = 0.75
    """The share of the peak FLOP/s kernels reach (default: typical, not measured)."""
    compute_curve: tuple[tuple[float, float], ...] = ()
    """Measured shares of the peak by a matmul's FLOPs, ``((flops, share), ...)`` in increasing
    FLOPs (``jitflops calibrate``): small products reach less of it. Where given, an op's share is
    read from it (log-interpolated, clamped at its ends) times :attr:`compute_efficiency`."""
    dtype_curves: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    """Curves like :attr:`compute_curve`, one per key of :attr:`peak_flops` measured (``jitflops
    calibrate`` on a GPU): a small bfloat16 product reaches a smaller share of the bfloat16 peak
    than a float32 one of the float32 peak. A dtype without one takes :attr:`compute_curve`."""
    memory_efficiency: float = 0.85
    """The share of the bandwidth kernels reach (default: typical, not measured)."""
    launch_s: float = 5e-6
    """A fixed cost per kernel (a CUDA launch, an eager op's dispatch on the CPU)."""
    source: str = ""
    products: Mapping[str, ProductGrid] = field(default_factory=dict)
    """Measured product rates per dtype key, by rows and weight size (``jitflops calibrate``): where
    an op's dtype has one, a product's time is read from it, not from the peak and curve above."""
    kernel_curves: Mapping[str, Curve] = field(default_factory=dict)
    """Measured kernel times per op family (``jitflops calibrate``; :mod:`jitflops.estimates.costs`
    names the families and their units of work): where an op's family has one, its kernel's time is
    read from it; elsewhere from the roofline."""
    host_s: Mapping[str, float] = field(default_factory=dict)
    """Seconds of host time per eager call by kind (:data:`HOST_KINDS`: :mod:`jitflops.estimates.execution`):
    Python, dispatch and allocation, spent before a kernel starts. Where a kind is missing,
    :attr:`launch_s` stands for an op and a backward op, and nothing for the rest."""
    emulated: tuple[str, ...] = ()
    """Dtype keys the device computes without vector units (bfloat16 on a CPU without AVX-512 BF16
    or AMX): calibrated on small products only."""
    cache_bytes: Optional[int] = None
    """The last-level cache's bytes (``jitflops calibrate`` on a CPU)."""
    threads: Optional[int] = None
    """torch's intra-op threads where ``jitflops calibrate`` measured a CPU: with one, torch runs
    every float32 1 x 1 convolution of fewer than 16 images with its own kernel, not oneDNN's
    (:func:`~jitflops.estimates.costs.convolution.runs_natively`). None (a GPU's, a datasheet's): taken as more than one."""
    decode_products: Mapping[str, ProductGrid] = field(default_factory=dict)
    """Product rates per dtype key as a decode step runs them where the model's weights fit the
    last-level cache (``jitflops calibrate`` on a CPU, float32: passes over weights in the cache,
    the host's work on other ops before each product;
    :func:`~jitflops.timing.calibration.products.decode_grid`), by a step's batch and weight size
    (:meth:`for_decode`)."""
    pointwise_products: Mapping[str, ProductGrid] = field(default_factory=dict)
    """1 x 1 convolutions' rates per dtype key, by positions and weight size (``jitflops calibrate``
    on a CPU): oneDNN's convolution of a channels-first image, not the product of the same shape."""
    resident_pointwise_products: Mapping[str, ProductGrid] = field(default_factory=dict)
    """1 x 1 convolutions' rates per dtype key as a model whose weights fit the last-level cache
    runs them (``jitflops calibrate`` on a CPU: each call right after one of its own, its weights,
    oneDNN's buffers and its output's memory in the caches; :meth:`for_weights`)."""
    native_pointwise_products: Mapping[str, ProductGrid] = field(default_factory=dict)
    """1 x 1 convolutions' rates per dtype key where torch runs its own kernel instead of oneDNN's
    (``jitflops calibrate`` on a CPU: float32 images of one sample and at most 20,480 elements,
    :func:`~jitflops.estimates.costs.convolution.runs_natively`), by positions and weight size."""
    product_aspects: Mapping[str, ProductGrid] = field(default_factory=dict)
    """Product rates per dtype key of one weight size (the product grid's middle width squared), by
    rows and the weight's inner width K, half, equal to and twice that width (``jitflops calibrate``):
    a product's rate against a square weight's of its size, read by its K over its N (a weight
    that widens its input, 512 to 2,048, runs below the square one; one that narrows it, above)."""
    grouped_convolutions: Mapping[str, ProductGrid] = field(default_factory=dict)
    """Grouped convolutions' rates per dtype key (``jitflops calibrate``): a grid whose ``rows`` are
    the reduction of an output (a group's input channels times the kernel's area) and whose
    ``weights`` are the convolution's FLOPs. A group of 4 channels runs at a third of one of 64."""
    three_by_three_convolutions: Mapping[str, ProductGrid] = field(default_factory=dict)
    """Dense 3 x 3 convolutions' rates per dtype key, by output positions and weight size
    (``jitflops calibrate`` on a CPU, at stride 1): 512 channels over 7 x 7 positions run at half
    the rate of 64 over 56 x 56, at the same FLOPs."""
    operands_from_memory: float = 0.0
    """The share of an elementwise op's operands read from memory, not the caches (0 to 1; a spec
    file's ``true`` is 1): its kernel takes at least that share of its traffic at
    :attr:`memory_bandwidth` (:meth:`for_optimizer_step`). Curves are timed on operands a call's
    repeats keep in the caches."""
    matches: tuple[str, ...] = field(default=(), compare=False)
    """Fragments of ``torch.cuda.get_device_name`` that name this device, most specific first."""

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.memory_bandwidth, (int, float)) or not math.isfinite(self.memory_bandwidth) or self.memory_bandwidth <= 0:
            problems.append(f"memory_bandwidth must be a positive number of bytes per second, got {self.memory_bandwidth!r}")
        if not self.peak_flops:
            problems.append("peak_flops is empty: give at least one dtype's dense FLOP/s")
        for key, value in self.peak_flops.items():
            if key not in DTYPE_KEYS:
                problems.append(f"peak_flops has an unknown dtype {key!r} (known: {', '.join(DTYPE_KEYS)})")
            elif not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                problems.append(f"peak_flops[{key!r}] must be a positive FLOP/s, got {value!r}")
        for name, curve in [("compute_curve", self.compute_curve), *((f"dtype_curves[{key!r}]", curve) for key, curve in self.dtype_curves.items())]:
            if any(len(point) != 2 or not point[0] > 0 or not 0 < point[1] <= 1 for point in curve):
                problems.append(f"{name} must be (flops > 0, share in (0, 1]) pairs, got {curve!r}")
        for key in self.dtype_curves:
            if key not in DTYPE_KEYS:
                problems.append(f"dtype_curves has an unknown dtype {key!r} (known: {', '.join(DTYPE_KEYS)})")
        for name in ("compute_efficiency", "memory_efficiency"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value <= 1:
                problems.append(f"{name} must be in (0, 1], got {value!r}")
        if not isinstance(self.operands_from_memory, (int, float)) or not 0 <= self.operands_from_memory <= 1:
            problems.append(f"operands_from_memory must be a share in [0, 1] (a spec file's true is 1), got {self.operands_from_memory!r}")
        if not isinstance(self.launch_s, (int, float)) or self.launch_s < 0:
            problems.append(f"launch_s must be a non-negative number of seconds, got {self.launch_s!r}")
        for key in [*self.emulated, *(key for name in GRIDS for key in getattr(self, name))]:
            if key not in DTYPE_KEYS:
                problems.append(f"{', '.join(GRIDS)} and emulated take dtype keys, got {key!r} (known: {', '.join(DTYPE_KEYS)})")
        for family, points in self.kernel_curves.items():
            if not points or any(len(point) != 2 or not point[0] > 0 or not point[1] > 0 for point in points) or list(points) != sorted(points):
                problems.append(f"kernel_curves[{family!r}] must be (work > 0, seconds > 0) pairs in increasing work, got {points!r}")
        for kind, seconds in self.host_s.items():
            if kind not in HOST_KINDS or not isinstance(seconds, (int, float)) or seconds < 0:
                problems.append(f"host_s takes {', '.join(HOST_KINDS)} to non-negative seconds, got {kind!r}: {seconds!r}")
        if problems:
            raise DeviceSpecError(f"device spec {self.name!r}: " + "; ".join(problems))

    def peak_for(self, dtype: Optional[torch.dtype], tf32: bool = False) -> float:
        """The dense peak for ``dtype`` (float32 on tensor cores where ``tf32``), else the nearest
        wider one the spec has (an 8-bit float on a device without float8 runs as bfloat16)."""
        key = dtype_key(dtype, tf32)
        for candidate in _WIDER.get(key, (key,)):
            if candidate in self.peak_flops:
                return float(self.peak_flops[candidate])
        return float(max(self.peak_flops.values()))

    def compute_share(self, flops: float, dtype: Optional[str] = None) -> float:
        """The share of the peak an op of ``flops`` reaches: :attr:`compute_efficiency`, times the
        share at that size of the curve of ``dtype`` (a key of :attr:`peak_flops`), else of
        :attr:`compute_curve`, where the spec has one."""
        curve = self.dtype_curves.get(dtype, self.compute_curve)
        if not curve or flops <= 0:
            return self.compute_efficiency
        if flops <= curve[0][0]:
            return self.compute_efficiency * curve[0][1]
        for (low, low_share), (high, high_share) in zip(curve, curve[1:]):
            if flops <= high:
                weight = math.log(flops / low) / math.log(high / low)
                return self.compute_efficiency * (low_share + weight * (high_share - low_share))
        return self.compute_efficiency * curve[-1][1]

    def _cache_holds(self, nbytes: int) -> bool:
        """Whether ``nbytes`` take at most :data:`RESIDENT_SHARE` of the last-level cache (none known: no)."""
        return self.cache_bytes is not None and nbytes <= RESIDENT_SHARE * self.cache_bytes

    def for_weights(self, weight_bytes: int) -> "DeviceSpec":
        """The spec a model with ``weight_bytes`` of weights runs on: its 1 x 1 convolutions read
        from the grid timed in the cache (:attr:`resident_pointwise_products`) where the weights
        take at most :data:`RESIDENT_SHARE` of :attr:`cache_bytes` (the rest holds the
        activations), this spec otherwise. Its products read the grid timed from memory whatever
        its size: a forward reads each weight once, and its other weights and activations pass
        through the caches in between (a decode step: :meth:`for_decode`)."""
        if not self.resident_pointwise_products or not self._cache_holds(weight_bytes):
            return self
        return dataclasses.replace(self, pointwise_products={**self.pointwise_products, **self.resident_pointwise_products})

    def for_decode(self, working_bytes: int) -> "DeviceSpec":
        """The spec a decode step runs on whose weights and KV cache take ``working_bytes``: its
        products read the decode grid (:attr:`decode_products`) where those take at most
        :data:`RESIDENT_SHARE` of :attr:`cache_bytes`, this spec otherwise. A decode step rereads
        every weight a token later, with nothing but one token's activations between, so a model
        that fits the cache finds its weights there; a forward's or a prefill's activations
        pass through in between. On a 2-core EPYC VM, Llama GQA's decode step (6.3 MiB) was
        priced +36% to +50% from memory's grid, -19% to -35% from the decode grid (the rest of
        the step, its Python above all, priced under its time)."""
        if not self.decode_products or not self._cache_holds(working_bytes):
            return self
        return dataclasses.replace(self, products={**self.products, **self.decode_products})

    def for_optimizer_step(self, touched_bytes: int) -> "DeviceSpec":
        """The spec an optimizer's step runs on whose parameters, gradients and state take
        ``touched_bytes``: its elementwise ops read from memory the share of their operands that
        :data:`RESIDENT_SHARE` of :attr:`cache_bytes` does not hold (:attr:`operands_from_memory`;
        all of them where the cache is not known). A step reads each parameter's state a whole
        training step after it last wrote it, with the forward's and backward's tensors passed
        through the caches in between. On a 2-core EPYC VM (32 MiB last-level cache), AdamW's step a
        tensor at a time took 287 ms on GPT-2's parameters, 291 on BERT-base's and 3.2 on Llama
        GQA's (7.6 MB of them): priced -20%, -39% and -25% from the curves alone, +1%, -20% and +0%
        with this floor (the rest of BERT-base's, pages the heap faulted in afresh beside the large
        outputs'). Between the two, a small GPT's 56 MiB at one thread took 9.8 ms: -27% from the
        curves alone, +42% with all of it read from memory (2026-12-06); the next day +47% so, and +18%
        and +2% in two runs with this share (``tools/plan_host_accuracy.py``)."""
        if self._cache_holds(touched_bytes):
            return self
        held = RESIDENT_SHARE * self.cache_bytes / touched_bytes if self.cache_bytes is not None else 0.0
        return dataclasses.replace(self, operands_from_memory=1.0 - held)

    def time_shared(self, share: float) -> "DeviceSpec":
        """This spec for a process that gets ``share`` of its cores' time: more processes than cores
        (gloo ranks on one CPU host), each running in turn. Every time it gives is over ``share``.
        Timed while the others ran, a call shorter than the scheduler's slice (a few ms) runs within
        one and shows none of the sharing: 4 processes calibrating at once on 2 cores timed the
        product grid's small products at their rate alone and its large ones at half."""
        if not 0 < share <= 1:
            raise DeviceSpecError(f"a share of the cores' time must be in (0, 1], got {share!r}")

        def grids(named: Mapping[str, ProductGrid]) -> dict[str, ProductGrid]:
            return {key: dataclasses.replace(grid, rates=tuple(tuple(rate * share for rate in line) for line in grid.rates)) for key, grid in named.items()}
        return dataclasses.replace(
            self, name=f"{self.name} at {share:g} of its cores' time", peak_flops={key: value * share for key, value in self.peak_flops.items()},
            memory_bandwidth=self.memory_bandwidth * share, launch_s=self.launch_s / share, host_s={kind: value / share for kind, value in self.host_s.items()},
            kernel_curves={family: tuple((work, seconds / share) for work, seconds in curve) for family, curve in self.kernel_curves.items()},
            **{name: grids(getattr(self, name)) for name in GRIDS})

    def kernels_only(self) -> "DeviceSpec":
        """This spec without the host's time per call or a launch's: what its kernels alone take."""
        return dataclasses.replace(self, launch_s=0.0, host_s=dict.fromkeys(HOST_KINDS, 0.0))

    def to_json(self) -> str:
        document = {name: value for name, value in dataclasses.asdict(self).items() if name != "matches"}
        return json.dumps(document, indent=1)

    def host_seconds(self, kind: str) -> float:
        """Host time of an eager call of ``kind`` (:data:`HOST_KINDS`); a library's call without
        its own (:data:`LIBRARY_CALLS`) an op's."""
        if kind in LIBRARY_CALLS and kind not in self.host_s:
            kind = "op"
        return self.host_s.get(kind, self.launch_s if kind in ("op", "backward") else 0.0)

    @classmethod
    def from_mapping(cls, document: Mapping[str, Any], origin: str = "") -> "DeviceSpec":
        known = {field.name for field in dataclasses.fields(cls)} - {"matches"}
        document = {key: value for key, value in document.items() if key not in RETIRED_KEYS}
        unknown = set(document) - known
        missing = {"name", "peak_flops", "memory_bandwidth"} - set(document)
        if unknown or missing:
            parts = ([f"missing {', '.join(sorted(missing))}"] if missing else []) + ([f"unknown keys {', '.join(sorted(unknown))}"] if unknown else [])
            raise DeviceSpecError(f"device spec {origin or document.get('name', '?')!r}: {'; '.join(parts)} (keys: {', '.join(sorted(known))})")
        curve = tuple(tuple(point) for point in document.get("compute_curve", ()))
        curves = {key: tuple(tuple(point) for point in points) for key, points in document.get("dtype_curves", {}).items()}
        grids = {}
        for name in GRIDS:
            try:
                grids[name] = {key: ProductGrid.from_mapping(grid) for key, grid in document.get(name, {}).items()}
            except (KeyError, TypeError, ValueError) as error:
                raise DeviceSpecError(f"device spec {origin or document.get('name', '?')!r}: {name}: {error}") from None
        kernels = {family: tuple(tuple(point) for point in points) for family, points in document.get("kernel_curves", {}).items()}
        return cls(**{**document, "peak_flops": dict(document["peak_flops"]), "compute_curve": curve, "dtype_curves": curves, **grids,
                      "kernel_curves": kernels, "host_s": dict(document.get("host_s", {})), "emulated": tuple(document.get("emulated", ()))})


_WIDER = {"float8": ("float8", "int8", "bfloat16", "float16"), "int8": ("int8", "float8", "bfloat16"), "tf32": ("tf32", "float32"),
          "float16": ("float16", "bfloat16"), "bfloat16": ("bfloat16", "float16"), "float64": ("float64", "float32")}


def dtype_key(dtype: Optional[torch.dtype], tf32: bool = False) -> str:
    """A dtype's key in a spec's peaks (float32 where unknown)."""
    if dtype is None:
        return "tf32" if tf32 else "float32"
    if dtype in _FLOAT8:
        return "float8"
    if dtype in (torch.int8, torch.uint8):
        return "int8"
    if dtype == torch.float32 and tf32:
        return "tf32"
    return str(dtype).removeprefix("torch.")


def _tflops(**peaks: float) -> dict[str, float]:
    return {key: value * TERA for key, value in peaks.items()}


_H100_SXM = _tflops(float64=67.0, float32=67.0, tf32=494.5, bfloat16=989.5, float16=989.5, float8=1979.0, int8=1979.0)
_MI300X = _tflops(float64=163.4, float32=163.4, tf32=653.7, bfloat16=1307.4, float16=1307.4, float8=2614.9, int8=2614.9)
_A100 = _tflops(float64=19.5, float32=19.5, tf32=156.0, bfloat16=312.0, float16=312.0, int8=624.0)
_A10 = _tflops(float32=31.2, tf32=62.5, bfloat16=125.0, float16=125.0, int8=250.0)

DEVICES: dict[str, DeviceSpec] = {spec.name: spec for spec in (
    DeviceSpec("h100-nvl", _tflops(float64=60.0, float32=60.0, tf32=417.5, bfloat16=835.5, float16=835.5, float8=1671.0, int8=1671.0),
               3.9e12, 94 * 2**30, source="NVIDIA H100 Tensor Core GPU datasheet, H100 NVL column", matches=("H100 NVL",)),
    DeviceSpec("h100-pcie", _tflops(float64=51.0, float32=51.0, tf32=378.0, bfloat16=756.0, float16=756.0, float8=1513.0, int8=1513.0),
               2.0e12, 80 * 2**30, source="NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe column", matches=("H100 PCIe",)),
    DeviceSpec("h100-sxm", _H100_SXM, 3.35e12, 80 * 2**30, source="NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column", matches=("H100",)),
    DeviceSpec("h200", _H100_SXM, 4.8e12, 141 * 10**9, source="NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column", matches=("H200",)),
    DeviceSpec("gh200", _H100_SXM, 4.0e12, 96 * 2**30, source="NVIDIA GH200 Grace Hopper Superchip datasheet (96 GB HBM3)", matches=("GH200",)),
    DeviceSpec("b200", _tflops(float64=40.0, float32=80.0, tf32=1100.0, bfloat16=2250.0, float16=2250.0, float8=4500.0, int8=4500.0),
               8.0e12, 180 * 10**9, source="NVIDIA DGX B200 datasheet, per GPU (the DGX's totals / 8)", matches=("B200",)),
    DeviceSpec("a100-80gb", _A100, 2.039e12, 80 * 2**30, source="NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column", matches=("A100-SXM4-80GB", "A100 80GB", "A100-PCIE-80GB")),
    DeviceSpec("a100-40gb", _A100, 1.555e12, 40 * 2**30, source="NVIDIA A100 Tensor Core GPU datasheet, A100 40GB column", matches=("A100",)),
    DeviceSpec("l40s", _tflops(float32=91.6, tf32=183.0, bfloat16=362.05, float16=362.05, float8=733.0, int8=733.0),
               864e9, 48 * 2**30, source="NVIDIA L40S datasheet", matches=("L40S",)),
    DeviceSpec("l4", _tflops(float32=30.3, tf32=60.0, bfloat16=121.0, float16=121.0, float8=242.5, int8=242.5),
               300e9, 24 * 2**30, source="NVIDIA L4 Tensor Core GPU datasheet", matches=("L4",)),
    DeviceSpec("a10g", _A10, 600e9, 24 * 2**30, source="NVIDIA A10 datasheet (AWS's A10G is an A10 variant: the A10's figures)", matches=("A10G",)),
    DeviceSpec("a10", _A10, 600e9, 24 * 2**30, source="NVIDIA A10 Tensor Core GPU datasheet", matches=("A10",)),
    DeviceSpec("rtx-6000-ada", _tflops(float32=91.1, tf32=182.1, bfloat16=364.2, float16=364.2, float8=728.5, int8=728.5),
               960e9, 48 * 2**30, source="NVIDIA RTX 6000 Ada Generation datasheet", matches=("RTX 6000 Ada",)),
    DeviceSpec("a6000", _tflops(float32=38.7, tf32=77.4, bfloat16=154.8, float16=154.8, int8=309.7), 768e9, 48 * 2**30,
               source="NVIDIA RTX A6000 datasheet", matches=("A6000",)),
    DeviceSpec("v100", _tflops(float64=7.8, float32=15.7, float16=125.0), 900e9, 32 * 2**30,
               source="NVIDIA V100 Tensor Core GPU datasheet, V100 SXM2 column", matches=("V100",)),
    DeviceSpec("mi325x", _MI300X, 6.0e12, 256 * 10**9, source="AMD Instinct MI325X product page (peak matrix performance)", matches=("MI325X",)),
    DeviceSpec("mi300x", _MI300X, 5.3e12, 192 * 10**9, source="AMD Instinct MI300X product page (peak matrix performance)", matches=("MI300X",)),
    DeviceSpec("mi300a", _tflops(float64=122.6, float32=122.6, tf32=490.3, bfloat16=980.6, float16=980.6, float8=1961.2, int8=1961.2),
               5.3e12, 128 * 10**9, source="AMD Instinct MI300A product page (peak matrix performance)", matches=("MI300A",)),
    DeviceSpec("mi250x", _tflops(float64=95.7, float32=95.7, bfloat16=383.0, float16=383.0, int8=383.0), 3.2768e12, 128 * 10**9,
               source="AMD Instinct MI250X product page (peak matrix performance)", matches=("MI250X",)),
)}
"""Datasheet devices by name (``h100-sxm``, ``a100-80gb``, ...); :func:`device_spec` also takes aliases."""

ALIASES = {"h100": "h100-sxm", "a100": "a100-80gb", "mi300": "mi300x", "rtx6000ada": "rtx-6000-ada"}


def _normalised(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def known_device_names() -> list[str]:
    return sorted([*DEVICES, *ALIASES])


def device_spec(device: Union[str, Path, DeviceSpec, Mapping[str, Any]]) -> DeviceSpec:
    """A spec from a device name (``"h100"``, ``"a100-40gb"``), a JSON file written by
    ``jitflops calibrate`` (or by hand), a mapping of its fields, or a spec itself."""
    if isinstance(device, DeviceSpec):
        return device
    if isinstance(device, Mapping):
        return DeviceSpec.from_mapping(device)
    text = str(device)
    if text.endswith(".json") or Path(text).is_file():
        try:
            document = json.loads(Path(text).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise DeviceSpecError(f"cannot read the device spec {text!r}: {error}") from None
        if not isinstance(document, Mapping):
            raise DeviceSpecError(f"the device spec {text!r} is not a JSON object")
        return DeviceSpec.from_mapping(document, text)
    key = _normalised(text)
    key = ALIASES.get(key, key)
    if key in DEVICES:
        return DEVICES[key]
    close = difflib.get_close_matches(key, known_device_names(), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise DeviceSpecError(f"unknown device {text!r}{hint} (known: {', '.join(known_device_names())}, or a spec file from 'jitflops calibrate')")


def is_device_name(text: str) -> bool:
    """Whether ``text`` names a device of the table (not a torch device such as ``cuda:0``)."""
    key = _normalised(text)
    return ALIASES.get(key, key) in DEVICES


def is_cpu_spec(spec: DeviceSpec) -> bool:
    """Whether ``spec`` is a CPU's (``jitflops calibrate`` names a CPU's spec ``cpu (N threads)``)."""
    return "cpu" in spec.name.lower()


def describes(spec: DeviceSpec, device_name: str) -> bool:
    """Whether ``spec`` is of the device named ``device_name`` (``"cpu"``, or a GPU's name as
    ``torch.cuda.get_device_name`` gives it): only then may a time predicted with it be compared
    with one measured there."""
    if device_name == "cpu":
        return is_cpu_spec(spec)
    listed = spec_of_gpu(device_name)
    return spec.name == device_name or (listed is not None and listed.name == spec.name)


def spec_of_gpu(device_name: str) -> Optional[DeviceSpec]:
    """The table's spec of a GPU named ``device_name`` (``torch.cuda.get_device_name``)."""
    for spec in sorted(DEVICES.values(), key=lambda spec: -max((len(fragment) for fragment in spec.matches), default=0)):
        if any(fragment.lower() in device_name.lower() for fragment in spec.matches):
            return spec
    return None
