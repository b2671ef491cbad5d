"""Matrix products: the FLOP/s a product reaches by its rows and its weight's size, per dtype.

A product's rate depends on more than its FLOPs: one row against a 4,096 x 4,096 weight streams the
weight from memory for 2 FLOPs an element (a CPU reaches a tenth of its peak), while 512 rows reuse
each weight element 512 times. So products are timed on a grid of rows (tokens) by square weights,
``F.linear`` as models call it, each call on weights from memory; the spec keeps the grid of rates
(:class:`~jitflops.estimates.devices.ProductGrid`), which every model's products read, whatever
its size: a forward reads each weight once, with its other weights and activations through the
caches in between. A decode step is the exception (:func:`decode_grid`): it rereads a model's
weights a token later, and where they fit a CPU's last-level cache they are still there. Batched products (attention's scores
and values) get a curve of their own, by FLOPs. A dtype the device computes without vector units (bfloat16 on a
CPU without AVX-512 BF16 or AMX runs at a hundredth of float32's rate) is found by one small
product and timed on small products only: it is marked emulated, and a calibration stays within its
budget on any CPU.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from pathlib import Path
from typing import Callable, Hashable, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F

from ...estimates.devices import ProductGrid
from .budget import Budget, CallTimer, Maker, interleaved_medians, measured_curve, on_activations

CPU_ROWS = (1, 8, 16, 32, 64, 128, 256, 512, 2048)
CPU_WIDTHS = (256, 512, 1024, 2048, 4096)
GPU_ROWS = (1, 8, 64, 512, 4096, 16384)
GPU_WIDTHS = (1024, 2048, 4096, 8192)
"""Rows (tokens) and square weights' widths of the grid: a product of M rows by a K x N weight is
read at M and K x N, between the grid's neighbours on log scales. A CPU's rate rises steeply and
bends below 256 rows: read between 8 and 32 rows, 16 rows' rate was 17-18% low, between 32 and
128, 64 rows' 3-10% (a 2-core EPYC, weights of 256 x 1,024 to 1,024²)."""

CPU_MOST_FLOPS = 4e9
"""Products above this many FLOPs are not timed on a CPU (0.03 to 0.5 s each): the grid takes the
rate of the largest timed one of their row."""

EMULATED_BELOW = 0.1
"""A dtype whose small product runs below this share of float32's rate is emulated."""

_PROBE = (128, 512, 512)


def last_level_cache_bytes() -> Optional[int]:
    """The size of this CPU's last-level cache, as Linux reports it (None where it does not)."""
    sizes = {}
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level, size, kind = ((entry / name).read_text().strip() for name in ("level", "size", "type"))
        except OSError:
            continue
        if kind != "Instruction":
            units = {"K": 2**10, "M": 2**20, "G": 2**30}
            sizes[int(level)] = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    return sizes[max(sizes)] if sizes else None


def _operands(device: torch.device, dtype: torch.dtype, rows: int, width: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = torch.randn(rows, width, device=device).to(dtype)
    return x, [torch.randn(width, width, device=device).to(dtype) for _ in range(3)]


def product_rate(timer: CallTimer, dtype: torch.dtype, rows: int, width: int) -> float:
    """The FLOP/s of ``F.linear`` of ``rows`` by a ``width`` x ``width`` weight in ``dtype``."""
    x, weights = _operands(timer.device, dtype, rows, width)
    turns = itertools.cycle(weights)
    seconds = timer.median(lambda: F.linear(x, next(turns)))
    return 2.0 * rows * width * width / seconds


def has_vector_units(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the CPU computes ``dtype`` natively (bfloat16: AVX-512 BF16 or AMX; float16: AMX-FP16),
    as torch reports it; a GPU does every dtype it has."""
    if device.type != "cpu" or dtype in (torch.float32, torch.float64):
        return True
    probes = {torch.bfloat16: ("_is_avx512_bf16_supported", "_is_amx_tile_supported"), torch.float16: ("_is_amx_fp16_supported",)}
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes.get(dtype, ()))


def is_emulated(timer: CallTimer, dtype: torch.dtype, float32_rate: float) -> bool:
    """Whether ``dtype``'s products are emulated here: no vector units for it, or a small product far
    below float32's rate."""
    if not has_vector_units(timer.device, dtype):
        return True
    rows, width, _ = _PROBE
    try:
        return product_rate(timer, dtype, rows, width) < EMULATED_BELOW * float32_rate
    except RuntimeError:  # no product of this dtype here
        return True


def product_grid(timer: CallTimer, dtype: torch.dtype, budget: Budget, rows: Sequence[int], widths: Sequence[int],
                 most_flops: float = float("inf")) -> ProductGrid:
    """The grid of ``dtype``'s rates, its products timed in interleaved passes (smallest first) while
    ``budget`` lasts; a product not timed (over ``most_flops``, or one the budget cannot afford)
    takes the rate of the largest timed one of its row, or of the row below. Each size's calls take
    3 weights in turn."""
    operands = functools.lru_cache(maxsize=None)(lambda width: _operands(timer.device, dtype, max(rows), width))  # made at a width's first product
    cells = sorted(((2.0 * row * width * width, row, width) for row in rows for width in widths if 2.0 * row * width * width <= most_flops))

    def maker(row: int, width: int) -> Maker:
        def make() -> Callable[[], object]:
            x, weights = operands(width)
            rows_of_x = x[:row]
            turns = itertools.cycle(weights)
            return lambda: F.linear(rows_of_x, next(turns))
        return make
    medians = interleaved_medians(timer, budget, [(flops, maker(row, width)) for flops, row, width in cells])
    timed = {(row, width): flops / seconds for (flops, row, width), seconds in zip(cells, medians) if seconds is not None}
    return measured_grid(rows, [width * width for width in widths], timed, (rows, widths))


def measured_grid(rows: Sequence[int], weights: Sequence[int], timed: Mapping[tuple[Hashable, Hashable], float],
                  keys: Optional[tuple[Sequence[Hashable], Sequence[Hashable]]] = None) -> ProductGrid:
    """The grid of ``rows`` by ``weights`` whose ``timed`` cells (keyed by ``keys``' row and
    column, by default the grid's own) have their rates and the rest the rates :func:`filled_rates`
    gives them, with which were timed."""
    row_keys, column_keys = keys or (rows, weights)
    return ProductGrid(tuple(rows), tuple(weights), filled_rates(row_keys, column_keys, timed),
                       tuple(tuple((row, column) in timed for column in column_keys) for row in row_keys))


def filled_rates(rows: Sequence[Hashable], columns: Sequence[Hashable], timed: Mapping[tuple[Hashable, Hashable], float]) -> tuple[tuple[float, ...], ...]:
    """A grid's rates from the ``timed`` (row, column) cells (at least one): a cell not timed takes
    the rate of the largest timed one of its row, or of the row below; a row below every timed one
    (a budget that timed only the smallest work, in another row) the row above's; a column before
    every timed one the first rate of its row."""
    if not timed:
        raise ValueError("a grid needs at least one timed cell")
    filled: list[list[Optional[float]]] = []
    for row in rows:
        line: list[Optional[float]] = []
        last = None
        for index, column in enumerate(columns):
            last = timed.get((row, column), last)
            line.append(last if last is not None else (filled[-1][index] if filled else None))
        filled.append(line)
    for index in range(len(filled) - 2, -1, -1):
        filled[index] = [rate if rate is not None else above for rate, above in zip(filled[index], filled[index + 1])]
    return tuple(tuple(rate if rate is not None else next(later for later in line[index:] if later is not None) for index, rate in enumerate(line))
                 for line in filled)


def aspect_grid(timer: CallTimer, dtype: torch.dtype, budget: Budget, rows: Sequence[int], width: int, most_flops: float = float("inf"),
                widening: bool = True) -> ProductGrid:
    """Rates of products of one weight size, ``width`` squared, by rows and the weight's inner width K:
    half (where ``widening``), equal to and twice ``width`` (N the rest), timed in interleaved passes
    while ``budget`` lasts (a row over ``most_flops`` takes the rates of the row below). MKL runs a
    weight that narrows its input faster than the square one of its size: on the 2-core EPYC, 128
    rows by 2,048 x 512 at 146 GFLOP/s, by 1,024 x 1,024 at 123. One that widens it ran slower here
    (512 x 2,048 at 112, 0.79 to 0.95 of the square one's rate by rows), but not in a model's forward:
    read so until 2026-11-29, it priced the widening layers of the studied models over their time
    (BERT-base's ``intermediate.dense`` +17%, GPT-2's ``c_fc`` +11%, their worst modules). A CPU's
    calibration leaves it out (``widening`` False), and a widening weight reads the square one's
    rate (:func:`~jitflops.estimates.costs.products.aspect_factor`): on one spec the leaf modules'
    median error went from 11% and 8% to 5-7% and 2% (BERT-base, GPT-2), and on the held-out models
    from 16% to 8% (T5-small), 19% to 15% (Swin-T), 16% to 12% (ConvNeXt-T) and 9% to 3% (ViT-B/16).
    A GPU's keeps it: nothing measured there says otherwise."""
    inners = (width // 2, width, 2 * width) if widening else (width, 2 * width)
    cells = sorted((2.0 * row * width * width, row, inner) for row in rows for inner in inners if 2.0 * row * width * width <= most_flops)

    def maker(row: int, inner: int) -> Maker:
        def make() -> Callable[[], object]:
            x = torch.randn(row, inner, device=timer.device).to(dtype)
            weights = itertools.cycle([torch.randn(width * width // inner, inner, device=timer.device).to(dtype) for _ in range(3)])
            return lambda: F.linear(x, next(weights))
        return make
    medians = interleaved_medians(timer, budget, [(flops, maker(row, inner)) for flops, row, inner in cells])
    timed = {(row, inner): flops / seconds for (flops, row, inner), seconds in zip(cells, medians) if seconds is not None}
    return measured_grid(rows, inners, timed)


DECODE_ROWS = (1, 4, 16)
"""Rows of the decode grid: a decode step's batch, one token a sequence."""

DECODE_ROTATION = 0.25
"""The share of the last-level cache the decode grid's weights take, taken in turn: more than a
core's own caches hold (a quarter of a 32 MiB L3 against a 1 MiB L2), less than the cache."""

DECODE_HOST_OPS = 30
"""Small ops the host runs before each product of the decode grid (40 us on a 2-core EPYC): a
decode step runs ten ops and its Python between two products (Llama GQA's 168 ops and 10,161
bytecode instructions around its 15 products)."""

DECODE_RERUNS = 2
"""Untimed passes over a cell's weights before its timed one: the step before left them in the cache."""


class _TimesItself(CallTimer):
    """The CPU's timer of calls that time themselves: each returns its own seconds (a decode grid's
    pass, its products and not the host's work between them)."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"), flush=False)

    def seconds(self, run: Callable[[], object]) -> float:
        return float(run())  # type: ignore[arg-type]


def _products_between_host_work(x: torch.Tensor, weights: Sequence[torch.Tensor]) -> float:
    """The mean time of a product of ``x`` by each of ``weights`` in turn, each after
    :data:`DECODE_HOST_OPS` small ops (not timed), in the last of :data:`DECODE_RERUNS` + 1 passes."""
    small = torch.ones(1, 256)
    spent = 0.0
    for _ in range(DECODE_RERUNS + 1):
        spent = 0.0
        for weight in weights:
            for _ in range(DECODE_HOST_OPS):
                torch.add(small, small)
            started = time.perf_counter()
            F.linear(x, weight)
            spent += time.perf_counter() - started
    return spent / len(weights)


def decode_grid(budget: Budget, widths: Sequence[int], cache_bytes: int) -> Optional[ProductGrid]:
    """float32's products as a CPU's decode step runs them, for a model whose weights fit its
    last-level cache of ``cache_bytes`` (None: no width of ``widths`` fits
    :data:`DECODE_ROTATION` of it twice): by :data:`DECODE_ROWS` rows, each cell a pass over
    weights filling that share, each product after the host's work on other ops
    (:data:`DECODE_HOST_OPS`), the weights read a pass before (:data:`DECODE_RERUNS`); cells in
    turn, while ``budget`` lasts (:func:`~.budget.interleaved_medians`).

    On a 2-core EPYC VM (32 MiB L3), Llama GQA's 15 products (6.3 MiB of weights) took 0.27-0.30
    ms a decode step (module hooks, less their calls), and 0.80 with one thread. This grid prices
    them at 0.21-0.25 ms. Memory's grid prices them at 1.12 ms: it flushes the caches before each call,
    and a call on a weight of 256 x 256 pays 25 us more for it than a pass over weights from
    memory does (58 us against 33). A pass with no work between products, as a grid timed until
    2026-12-06 did, prices them at 0.19 ms."""
    rotation = int(cache_bytes * DECODE_ROTATION)
    fitting = [width for width in widths if 2 * width * width * 4 <= rotation]
    if not fitting:
        return None
    weights = {width: [torch.randn(width, width) for _ in range(math.ceil(rotation / (width * width * 4)))] for width in fitting}
    cells = sorted((2.0 * row * width * width, row, width) for row in DECODE_ROWS for width in fitting)

    def maker(row: int, width: int) -> Maker:
        def make() -> Callable[[], object]:
            x = torch.randn(row, width)
            return lambda: _products_between_host_work(x, weights[width])
        return make
    medians = interleaved_medians(_TimesItself(), budget, [(flops, maker(row, width)) for flops, row, width in cells])
    timed = {(row, width): flops / seconds for (flops, row, width), seconds in zip(cells, medians) if seconds is not None}
    return measured_grid(DECODE_ROWS, [width * width for width in fitting], timed, (DECODE_ROWS, fitting))


BATCHED_SIZES = ((4, 16), (4, 32), (12, 16), (12, 32), *((batch, length) for batch in (12, 48) for length in (64, 128, 256, 512, 1024)))
"""(batch, length) of the batched products timed: from a small vision transformer's attention
(LeViT's 4 to 16 heads of 16 to 196 tokens: 0.1 to 10 MFLOPs, 4 to 60 us a call on a 2-core EPYC)
to a long sequence's. Before 2026-11-29 the smallest was 12 x 64 (6 MFLOPs, 78 us), under which
every product was priced at that time, LeViT-128S's 28 at 2.3 ms a forward against 0.5 measured."""


def batched_curve(timer: CallTimer, dtype: torch.dtype, budget: Budget, host_s: float = 0.0, sizes: Sequence[tuple[int, int]] = BATCHED_SIZES,
                  head_dim: int = 64) -> tuple[tuple[float, float], ...]:
    """Batched products as attention runs them, (batch, length, head_dim) by (batch, head_dim,
    length), at each (batch, length) of ``sizes``, on operands the op before has just written
    (``timer`` produces them: both are activations): (FLOPs, seconds) points, ``host_s`` (the
    host's time of a call, which the prediction adds) taken off."""

    def call_of(size: tuple[int, int]) -> tuple[float, Maker]:
        batch, length = size

        def make() -> Callable[[], object]:
            q = torch.randn(batch, length, head_dim, device=timer.device).to(dtype)
            k = torch.randn(batch, head_dim, length, device=timer.device).to(dtype)
            return on_activations(lambda: torch.bmm(q, k), q, k)
        return 2.0 * batch * length * length * head_dim, make
    return measured_curve(timer, budget, sizes, call_of, host_s)
