"""What a calibration measures, as data a spec file holds, and how a time is read from it.

A curve is ``((work, seconds), ...)`` in increasing work, in its family's unit (FLOPs, elements):
a time is read between two points on a log-log line; above the last point at the last point's rate
(more work takes proportionally longer), below the first at the first point's time (a kernel takes
no less than the smallest one timed). Products are a grid of rates by rows and weight size
(:class:`ProductGrid`), read between four points on log scales.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

Curve = tuple[tuple[float, float], ...]


def curve_seconds(curve: Curve, work: float) -> float:
    """The time ``curve`` gives for ``work`` (0 for no work)."""
    if work <= 0 or not curve:
        return 0.0
    first_work, first_seconds = curve[0]
    if work <= first_work:
        return first_seconds
    last_work, last_seconds = curve[-1]
    if work >= last_work:
        return last_seconds * work / last_work
    index = bisect.bisect_left([point[0] for point in curve], work)
    (low, low_s), (high, high_s) = curve[index - 1], curve[index]
    weight = math.log(work / low) / math.log(high / low)
    return math.exp(math.log(low_s) + weight * (math.log(high_s) - math.log(low_s)))


def _between(values: Sequence[float], value: float) -> tuple[int, int, float]:
    """The two neighbours of ``value`` in increasing ``values`` and its log-scale weight between them (clamped)."""
    if value <= values[0]:
        return 0, 0, 0.0
    if value >= values[-1]:
        return len(values) - 1, len(values) - 1, 0.0
    high = bisect.bisect_left(values, value)
    low = high - 1
    return low, high, math.log(value / values[low]) / math.log(values[high] / values[low])


@dataclass(frozen=True)
class ProductGrid:
    """Measured FLOP/s of products: ``rates[i][j]`` of ``rows[i]`` rows by a weight of
    ``weights[j]`` elements (``jitflops calibrate``: :mod:`jitflops.timing.calibration.products`).
    ``timed[i][j]`` says whether that rate was timed or filled in from its neighbours' (a product
    over the calibration's budget: :func:`~jitflops.timing.calibration.products.filled_rates`);
    None where every rate was timed, or the spec does not say."""

    rows: tuple[int, ...]
    weights: tuple[int, ...]
    rates: tuple[tuple[float, ...], ...]
    timed: Optional[tuple[tuple[bool, ...], ...]] = None

    def __post_init__(self) -> None:
        if len(self.rates) != len(self.rows) or any(len(row) != len(self.weights) for row in self.rates):
            raise ValueError(f"a product grid needs {len(self.rows)} rows of {len(self.weights)} rates")
        if self.timed is not None and (len(self.timed) != len(self.rows) or any(len(row) != len(self.weights) for row in self.timed)):
            raise ValueError(f"a product grid's timed cells need {len(self.rows)} rows of {len(self.weights)}")
        if any(not (rate > 0) for row in self.rates for rate in row):
            raise ValueError("a product grid's rates must be positive FLOP/s")

    def rate(self, rows: float, weight: float) -> float:
        """The FLOP/s of ``rows`` rows by a weight of ``weight`` elements, read between the grid's points."""
        r0, r1, along_rows = _between(self.rows, rows)
        w0, w1, along_weights = _between(self.weights, weight)

        def at(r: int) -> float:
            return math.exp((1 - along_weights) * math.log(self.rates[r][w0]) + along_weights * math.log(self.rates[r][w1]))
        return math.exp((1 - along_rows) * math.log(at(r0)) + along_rows * math.log(at(r1)))

    @classmethod
    def from_mapping(cls, document: Mapping[str, Any]) -> "ProductGrid":
        timed = document.get("timed")
        return cls(tuple(document["rows"]), tuple(document["weights"]), tuple(tuple(row) for row in document["rates"]),
                   None if timed is None else tuple(tuple(bool(cell) for cell in row) for row in timed))

    def was_timed(self, row: int, column: int) -> bool:
        """Whether ``rates[row][column]`` was timed (not filled in from its neighbours')."""
        return self.timed is None or self.timed[row][column]
