"""A calibration in phases (``jitflops calibrate --phases N``): every number the median of the
phases' measurements, each phase a whole calibration in its share of the budget, one after the other.

A shared machine runs slow in stretches of seconds, and a stretch covers a whole family's timing (its
passes over its sizes are interleaved, a few seconds in all): on a 2-core EPYC VM, seven calibrations
of 40 s within 20 minutes (2026-12-07) put the float32 products' best rate at 84 to 165 GFLOP/s and
a tiny op's host time at 1.7 to 3.6 us, and predicted BERT-base's forward at 185 to 385 ms. Timed in
three phases, a stretch slows one phase of a family, and the median leaves it out: paired over 5
rounds, the worst model-round went from +67% to -34%. But each phase has a third of the budget, and
on a slow machine a phase's product grid stops short of its large cells, which take the rate of the
largest it timed: in one run (2026-12-07), a round's three-phase spec had no product past 128 rows by a
512 x 512 weight at another rate, and two rounds priced BERT-sized models 20% to 63% over their time.
So a grid's cell is the median of the phases that timed it (:class:`ProductGrid`'s ``timed``), and a
cell none timed is filled in from the medians. One phase stays the default (:data:`PHASES`): with three,
run U put the zoo's forwards 6% to 16% under their time (``docs/benchmarks.md``).

The spec's figures that follow from its grids (the peaks, the compute curves) and from its host
times (the launch cost) are read again from the medians (:func:`derived`).
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ...estimates.devices import GRIDS, DeviceSpec
from ...estimates.measured_curves import Curve, ProductGrid
from .products import measured_grid

PHASES = 1
"""Phases of a calibration by default: one, the whole budget (three: each a third of it)."""

Keyed = TypeVar("Keyed")


def monotone_shares(grid: ProductGrid) -> tuple[tuple[float, float], ...]:
    """The grid's rates as shares of its best by FLOPs, one point per size, made non-decreasing (a
    larger product reaching less than a smaller one is the machine's noise, not a property to
    predict): the compute curve of the ops the grid does not price."""
    rates = sorted((2.0 * rows * weight, rate) for rows, line in zip(grid.rows, grid.rates) for weight, rate in zip(grid.weights, line))
    best = max(rate for _, rate in rates)
    points: list[tuple[float, float]] = []
    for flops, rate in rates:
        share = max(rate / best, points[-1][1] if points else 0.0)
        if points and points[-1][0] == flops:
            points[-1] = (flops, max(points[-1][1], share))
        else:
            points.append((flops, share))
    return tuple(points)


def derived(products: Mapping[str, ProductGrid], host_s: Mapping[str, float]) -> dict[str, Any]:
    """A spec's figures read from its measurements: each dtype's peak (its products' best rate) and
    compute curve (:func:`monotone_shares`), the first dtype's as the compute curve, and the launch
    cost (a tiny op's host time)."""
    curves = {key: monotone_shares(grid) for key, grid in products.items()}
    return {"peak_flops": {key: max(max(line) for line in grid.rates) for key, grid in products.items()},
            "compute_curve": next(iter(curves.values()), ()), "dtype_curves": curves, "launch_s": host_s["op"]}


def _median_grid(grids: Sequence[ProductGrid]) -> ProductGrid:
    """Each cell's median rate over the grids that timed it, of the most common shape (an emulated
    dtype's grid, where one phase alone found it emulated, has fewer rows); a cell none timed is
    filled in from the medians (:func:`~.products.measured_grid`), not from each phase's fill: a
    phase whose share stopped short gives its largest cells the rate of a smaller one, and two such
    phases of three made the median theirs."""
    (rows, weights), _ = collections.Counter((grid.rows, grid.weights) for grid in grids).most_common(1)[0]
    alike = [grid for grid in grids if (grid.rows, grid.weights) == (rows, weights)]
    cells = {(row, column): [grid.rates[row][column] for grid in alike if grid.was_timed(row, column)]
             for row in range(len(rows)) for column in range(len(weights))}
    timed = {cell: statistics.median(rates) for cell, rates in cells.items() if rates}
    return measured_grid(rows, weights, timed, (range(len(rows)), range(len(weights))))


def _median_curve(curves: Sequence[Curve]) -> Curve:
    """Each work's median seconds, over the curves that timed it (a phase whose share ran out
    before the largest sizes has fewer points)."""
    by_work: dict[float, list[float]] = collections.defaultdict(list)
    for curve in curves:
        for work, seconds in curve:
            by_work[work].append(seconds)
    return tuple((work, statistics.median(by_work[work])) for work in sorted(by_work))


def _by_key(mappings: Sequence[Mapping[str, Keyed]], median: Callable[[list[Keyed]], Keyed]) -> dict[str, Keyed]:
    """Each key's ``median`` of its values, over the mappings that have it, in the order keys first appear."""
    keys = dict.fromkeys(key for mapping in mappings for key in mapping)
    return {key: median([mapping[key] for mapping in mappings if key in mapping]) for key in keys}


def median_spec(specs: Sequence[DeviceSpec]) -> DeviceSpec:
    """One spec from calibrations of one device (the first's name, source and fixed facts): each
    measured number the median of those that measured it."""
    first = specs[0]
    if len(specs) == 1:
        return first
    emulated, _ = collections.Counter(spec.emulated for spec in specs).most_common(1)[0]
    host_s = _by_key([spec.host_s for spec in specs], statistics.median)
    grids = {name: _by_key([getattr(spec, name) for spec in specs], _median_grid) for name in GRIDS}
    return dataclasses.replace(first, memory_bandwidth=statistics.median(spec.memory_bandwidth for spec in specs), emulated=emulated, host_s=host_s,
                               kernel_curves=_by_key([spec.kernel_curves for spec in specs], _median_curve), **grids,
                               **derived(grids["products"], host_s))
