"""The time of a collective on the links its group crosses: its bus bytes over the bus bandwidth the
group reaches, plus a fixed cost per step of the ring.

nccl-tests defines a collective's bus bandwidth so that it compares with a link's: bus bytes =
bytes x ``2(n-1)/n`` for an all-reduce, ``(n-1)/n`` for an all-gather or a reduce-scatter, 1 for a
send (:data:`~jitflops.handles.collectives.BUS_FACTORS`). A ring all-reduce takes ``2(n-1)`` steps, an
all-gather ``n-1``: each costs the tier's latency.

Where a group's ranks sit decides what it crosses. Ranks are numbered with tensor parallelism
innermost, then data parallelism, then pipeline stages (Megatron's order), so a group whose ranks
are ``stride`` apart spans ``stride x size`` consecutive ranks: inside a node where that is at most
its GPUs. A group across nodes has ``ranks_per_node`` of its ranks in each node, and NCCL runs one
ring per NIC (its channels), so the bytes leaving a node share that many NICs: the group's bus
bandwidth is that many NICs' (capped by the node's own links). A data-parallel group of a ``tp 2``
layout on DGX H100 nodes has 4 ranks per node: 4 x 50 GB/s; a pipeline's send, one rank: one NIC.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..handles.collectives import BUS_FACTORS, Collective
from .interconnects import Interconnect

RING_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "send": lambda n: 1, "recv": lambda n: 1, "barrier": lambda n: 2 * (n - 1)}
"""Latency steps of each collective's ring where it is not ``n - 1`` (a send: one)."""


@dataclass(frozen=True)
class Placement:
    """Where a group's ranks sit: ``size`` ranks, ``stride`` ranks apart, on nodes of ``gpus_per_node``."""

    size: int
    stride: int
    gpus_per_node: int

    @property
    def crosses_nodes(self) -> bool:
        return self.size > 1 and self.size * self.stride > self.gpus_per_node

    @property
    def ranks_per_node(self) -> int:
        return max(1, min(self.size, self.gpus_per_node // self.stride))


def bus_bandwidth(link: Interconnect, placement: Placement) -> float:
    """The bus bandwidth (bytes per second) a group placed so reaches on ``link``."""
    inside = link.intra_node_bandwidth * link.efficiency
    if not placement.crosses_nodes:
        return inside
    return min(inside, placement.ranks_per_node * link.inter_node_bandwidth * link.inter_node_efficiency)


def ring_terms(name: str, ranks: int, size: int) -> tuple[int, float]:
    """The latency steps of collective ``name`` on a ring of ``ranks``, and the bus bytes of ``size`` bytes."""
    return RING_STEPS.get(name, lambda n: n - 1)(ranks), size * BUS_FACTORS[name](ranks)


def collective_seconds(collective: Collective, link: Interconnect, placement: Placement) -> float:
    """The time of ``collective`` on ``link`` for a group placed so (a send: between two ranks so
    placed). A collective called right after compute also waits for its group's ranks to come to it
    (the link's ``blocked_wait_s``); a pipeline's send does not: its schedule's bubble is that wait,
    and the plan prices it (:mod:`.plan`)."""
    if collective.group_size <= 1 and collective.name not in ("send", "recv"):
        return 0.0
    steps, bus_bytes = ring_terms(collective.name, max(collective.group_size, 2), collective.bytes)
    wait = 0.0 if collective.name in ("send", "recv") else link.blocked_wait_s
    measured = link.measured_collectives.get(collective.name)
    if measured is not None and not placement.crosses_nodes:
        return bus_bytes / measured["bus_bandwidth"] + steps * measured["latency_s"] + wait
    return bus_bytes / bus_bandwidth(link, placement) + steps * link.latency(placement.crosses_nodes) + wait
