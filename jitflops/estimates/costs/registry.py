"""Kernel costs and the table that maps op kinds to them.

A kernel cost is a small pure function of an op record, the device spec and the op's FLOPs and
bytes (from the FLOP formulas and the traffic formulas): the seconds its kernel takes, read from the
curve the spec holds for the op's family, or None where the spec has none (a datasheet device):
the roofline prices it then (:func:`roofline_seconds`). Registered by decorator, one module
per op family, as the FLOP formulas are.
"""

from __future__ import annotations

from typing import Callable, Generic, Optional, TypeVar

from ...core.records import OpRecord
from ..devices import DeviceSpec

KernelCost = Callable[[OpRecord, DeviceSpec, float, float], Optional[float]]
"""(record, spec, flops, bytes) -> seconds of the op's kernel, or None: no curve for it here."""

Cost = TypeVar("Cost", bound=Callable)


class CostTable(Generic[Cost]):
    """Op kinds to their costs, filled by the ``register`` decorator of each family."""

    def __init__(self) -> None:
        self._costs: dict[str, Cost] = {}

    def register(self, *kinds: str) -> Callable[[Cost], Cost]:
        def decorate(cost: Cost) -> Cost:
            for kind in kinds:
                if kind in self._costs:
                    raise ValueError(f"kernel costs: {kind} registered twice")
                self._costs[kind] = cost
            return cost

        return decorate

    def get(self, kind: str) -> Optional[Cost]:
        return self._costs.get(kind)

    def kinds(self) -> frozenset[str]:
        return frozenset(self._costs)


KERNEL_COSTS: CostTable[KernelCost] = CostTable()


def memory_seconds(traffic: float, spec: DeviceSpec) -> float:
    """The seconds ``traffic`` bytes take at the bandwidth the spec's kernels reach."""
    return traffic / (spec.memory_efficiency * spec.memory_bandwidth)


def roofline_seconds(flops: float, traffic: float, peak: float, spec: DeviceSpec, dtype: str = "float32") -> float:
    """A kernel's time without a curve: the slower of its compute (its share of the peak by its size;
    ``dtype``: the key of the peak and of the compute curve) and its memory traffic, plus the spec's
    fixed cost per kernel."""
    if not flops and not traffic:
        return 0.0
    return max(flops / (spec.compute_share(flops, dtype) * peak), memory_seconds(traffic, spec)) + spec.launch_s


def curve_of(spec: DeviceSpec, family: str, dtype: Optional[str] = None) -> Optional[tuple[tuple[float, float], ...]]:
    """The spec's curve of ``family`` (for ``dtype`` where the family is measured per dtype; float32's
    where that dtype has none), or None."""
    if dtype is None:
        return spec.kernel_curves.get(family)
    return spec.kernel_curves.get(f"{family}.{dtype}") or spec.kernel_curves.get(f"{family}.float32")
