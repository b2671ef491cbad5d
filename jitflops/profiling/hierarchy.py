"""One hierarchy: every module with its parameters, MACs per op, activations and latency.

Built from the analyses (counts by trace) and a timed pass (latency), keyed by the same canonical
module names, so every printout and export reads one tree. A module reachable by several names (a
shared module) appears once, under its canonical name.
"""

from __future__ import annotations

import dataclasses
import typing
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Optional, Sequence

from torch import nn

from ..engine.activation_count import ActivationCountAnalysis
from ..estimates.byte_count import ByteCountAnalysis
from ..engine.communication import CommunicationAnalysis
from ..engine.integer_count import IntegerOpCountAnalysis
from ..engine.counting import module_aliases
from ..engine.flop_count import FlopCountAnalysis
from ..handles import ELEMENTWISE_FLOP_FORMULAS, short_op_name
from ..engine.parameter_count import parameter_count
from ..timing.timed_pass import LatencyStats


@dataclass
class ModuleProfile:
    """One module of the hierarchy. MACs follow fvcore's convention (one fused multiply-add is one);
    FLOPs are ``2 x MACs``, as DeepSpeed defines them, plus the elementwise flops (one per element,
    zero unless the analysis counted elementwise ops), which are not multiply-adds."""

    name: str
    type_name: str
    depth: int
    params: int
    macs_by_op: typing.Counter[str]
    elementwise_flops_by_op: typing.Counter[str]
    activations: int
    latency: Optional[LatencyStats]
    called: bool
    extra_repr: str = ""
    children: list["ModuleProfile"] = field(default_factory=list)
    comm_bytes_by_collective: typing.Counter[str] = field(default_factory=Counter)
    """Bytes moved by the collectives this module ran (nccl-tests' sizes), per collective."""
    int_macs_by_op: typing.Counter[str] = field(default_factory=Counter)
    """Integer multiply-accumulates (IOPs) of quantized and integer products, apart from :attr:`macs_by_op`."""
    masked_out_macs: int = 0
    """Attention MACs the masks discard (counted in :attr:`macs`, the dense convention; the
    mask-aware count is ``macs - masked_out_macs``)."""
    bytes: int = 0
    """Bytes its ops read and write (:class:`~jitflops.ByteCountAnalysis`)."""
    predicted_s: Optional[float] = None
    """Seconds the roofline predicts for it on the profile's prediction device (None: not asked for)."""
    predicted_where_timed: bool = True
    """Whether the prediction is for the device :attr:`latency` was measured on (an H100's
    prediction is not compared with a CPU's time)."""

    @property
    def intensity(self) -> Optional[float]:
        """Arithmetic intensity: FLOPs per byte read or written (None: it moves nothing)."""
        return self.flops / self.bytes if self.bytes else None

    def bound(self, ridge: Optional[float]) -> Optional[str]:
        """``"compute"`` or ``"memory"``: this module's intensity against a device's ``ridge`` point."""
        if ridge is None or self.intensity is None:
            return None
        return "compute" if self.intensity >= ridge else "memory"

    @property
    def predicted_to_measured(self) -> Optional[float]:
        """Predicted over measured time (None: not both, or not of the same device)."""
        if self.predicted_s is None or self.latency is None or self.latency.median <= 0 or not self.predicted_where_timed:
            return None
        return self.predicted_s / self.latency.median

    @property
    def macs(self) -> int:
        return sum(self.macs_by_op.values())

    @property
    def elementwise_flops(self) -> int:
        return sum(self.elementwise_flops_by_op.values())

    @property
    def comm_bytes(self) -> int:
        return sum(self.comm_bytes_by_collective.values())

    @property
    def int_macs(self) -> int:
        return sum(self.int_macs_by_op.values())

    @property
    def flops(self) -> int:
        return 2 * self.macs + self.elementwise_flops

    @property
    def flops_per_second(self) -> Optional[float]:
        """Achieved FLOP/s: this module's FLOPs over its median latency."""
        if self.latency is None or self.latency.median <= 0:
            return None
        return self.flops / self.latency.median

    def mfu(self, peak_flops: Optional[float]) -> Optional[float]:
        """Model FLOPs utilisation: the model's FLOP/s (the masks' discarded attention work left
        out) over ``peak_flops`` (None: not timed, or no peak)."""
        if self.flops_per_second is None or not peak_flops:
            return None
        return (self.flops - 2 * self.masked_out_macs) / self.latency.median / peak_flops

    def walk(self) -> Iterator["ModuleProfile"]:
        """This module and all below it, depth first, parents before children."""
        yield self
        for child in self.children:
            yield from child.walk()

    def find(self, name: str) -> "ModuleProfile":
        for node in self.walk():
            if node.name == name:
                return node
        raise KeyError(f"no module named {name!r} in the profile")


def _sum_of_children(children: list[ModuleProfile]) -> Optional[LatencyStats]:
    """Latency of a container that is never called itself (a ModuleList): its children's, added up."""
    timed = [child.latency for child in children if child.latency is not None]
    if not timed or len({len(stats.samples) for stats in timed}) != 1:
        return None
    return LatencyStats(tuple(map(sum, zip(*(stats.samples for stats in timed)))), 1)


def _subtract(latency: Optional[LatencyStats], removed: Optional[LatencyStats]) -> Optional[LatencyStats]:
    if latency is None or removed is None or len(latency.samples) != len(removed.samples):
        return latency
    return LatencyStats(tuple(max(0.0, a - b) for a, b in zip(latency.samples, removed.samples)), latency.calls_per_iteration)


def remove_module_types(root: ModuleProfile, model: nn.Module, ignored: Sequence[type]) -> ModuleProfile:
    """Drop modules of the ignored types from the tree (in place), and take their cost (MACs,
    activations, latency) out of every ancestor. Parameters stay: they are still in the model."""
    aliases = module_aliases(model)
    type_of = {name: type(module) for module, name in aliases.items() if isinstance(module, nn.Module)}
    types = tuple(ignored)
    if types:
        _remove_below(root, [], lambda node: issubclass(type_of[node.name], types))
    return root


def _remove_below(node: ModuleProfile, ancestors: list[ModuleProfile], removed: Callable[[ModuleProfile], bool]) -> None:
    """:func:`remove_module_types` under ``node``: each child ``removed`` says to drop is taken out
    of ``node`` and of every ancestor."""
    kept = []
    for child in node.children:
        if removed(child):
            for ancestor in ancestors + [node]:
                ancestor.macs_by_op = +(ancestor.macs_by_op - child.macs_by_op)
                ancestor.elementwise_flops_by_op = +(ancestor.elementwise_flops_by_op - child.elementwise_flops_by_op)
                ancestor.comm_bytes_by_collective = +(ancestor.comm_bytes_by_collective - child.comm_bytes_by_collective)
                ancestor.int_macs_by_op = +(ancestor.int_macs_by_op - child.int_macs_by_op)
                ancestor.masked_out_macs -= child.masked_out_macs
                ancestor.bytes -= child.bytes
                if ancestor.predicted_s is not None and child.predicted_s is not None:
                    ancestor.predicted_s -= child.predicted_s
                ancestor.activations -= child.activations
                ancestor.latency = _subtract(ancestor.latency, child.latency)
        else:
            _remove_below(child, ancestors + [node], removed)
            kept.append(child)
    node.children = kept


def build_hierarchy(
    model: nn.Module,
    flops: Optional[FlopCountAnalysis],
    activations: Optional[ActivationCountAnalysis] = None,
    latency: Optional[Mapping[str, LatencyStats]] = None,
    ignore_modules: Sequence[type] = (),
    communication: Optional[CommunicationAnalysis] = None,
    predicted: Optional[Mapping[str, float]] = None,
    predicted_where_timed: bool = True,
) -> ModuleProfile:
    """The model's module tree with counts, communication and latency (seconds per canonical module name) attached.
    The integer MACs, the attention work masks discard and the bytes moved are counted from
    ``flops``' recording; ``predicted`` holds the roofline's seconds per module, where asked for
    (``predicted_where_timed``: for the device ``latency`` was measured on).

    Modules of a type in ``ignore_modules`` are left out and their MACs, activations and latency
    are removed from their ancestors too (parameters stay: they are still in the model). Without
    ``flops`` the tree has the model's modules and parameters, nothing counted and nothing called.
    """
    aliases = module_aliases(model)
    params = parameter_count(model)
    macs = flops.by_module_and_operator() if flops is not None else {}
    acts = activations.by_module(emit_warnings=False) if activations is not None else Counter()
    comm = communication.by_module_and_operator() if communication is not None else {}
    int_macs = flops.of_same_recording(IntegerOpCountAnalysis).by_module_and_operator() if flops is not None else {}
    useful = flops.masked_attention().by_module(emit_warnings=False) if flops is not None else Counter()
    traffic = flops.of_same_recording(ByteCountAnalysis).by_module(emit_warnings=False) if flops is not None else Counter()
    dense = flops.by_module(emit_warnings=False) if flops is not None else Counter()
    uncalled = flops.uncalled_modules(emit_warnings=False) if flops is not None else None
    latency = latency or {}
    elementwise_keys = {short_op_name(kind) for kind in ELEMENTWISE_FLOP_FORMULAS.kinds()}

    def profile_of(module: nn.Module, name: str, depth: int) -> ModuleProfile:
        return ModuleProfile(
            name=name,
            type_name=type(module).__name__,
            depth=depth,
            params=params.get(name, 0),
            macs_by_op=Counter({op: n for op, n in macs.get(name, {}).items() if op not in elementwise_keys}),
            elementwise_flops_by_op=Counter({op: n for op, n in macs.get(name, {}).items() if op in elementwise_keys}),
            activations=acts.get(name, 0),
            latency=latency.get(name),
            called=uncalled is not None and name not in uncalled,
            extra_repr=module.extra_repr(),
            comm_bytes_by_collective=+Counter(comm.get(name, {})),
            int_macs_by_op=+Counter(int_macs.get(name, {})),
            masked_out_macs=dense.get(name, 0) - useful.get(name, 0),
            bytes=traffic.get(name, 0),
            predicted_s=predicted.get(name, 0.0) if predicted is not None else None,
            predicted_where_timed=predicted_where_timed,
        )

    root = profile_of(model, "", 0)
    made, pending = [root], [(model, root)]
    while pending:
        module, node = pending.pop()
        for key, child in module.named_children():
            child_name = f"{node.name}.{key}" if node.name else key
            if aliases[child] == child_name:  # shared modules live under their canonical name only
                child_node = profile_of(child, child_name, node.depth + 1)
                node.children.append(child_node)
                made.append(child_node)
                pending.append((child, child_node))
    for node in reversed(made):  # each node after its children
        if node.latency is None:  # never called itself (a ModuleList) or not timed
            node.latency = _sum_of_children(node.children)
    return remove_module_types(root, model, ignore_modules)


def _weighted_sum(counters: typing.Iterable[tuple[typing.Mapping[str, float], int]]) -> typing.Counter[str]:
    total: typing.Counter[str] = Counter()
    for counts, weight in counters:
        for key, value in counts.items():
            total[key] += value * weight
    return +total


def combined_trees(
    trees: Sequence[tuple[ModuleProfile, int]],
    latency_of: Callable[[str, list[Optional[LatencyStats]]], Optional[LatencyStats]],
) -> ModuleProfile:
    """One tree from several profiles of the same model: counts summed (each tree's times its
    weight: how many forwards it stands for), a module called if it was called in any, and its
    latency made by ``latency_of(name, the trees' latencies)`` (a container's, if that gives
    none, its children's added up)."""
    indexes = [({other.name: other for other in tree.walk()}, weight) for tree, weight in trees]
    return _merged(trees[0][0], indexes, latency_of)


def _merged(
    node: ModuleProfile,
    indexes: Sequence[tuple[Mapping[str, ModuleProfile], int]],
    latency_of: Callable[[str, list[Optional[LatencyStats]]], Optional[LatencyStats]],
) -> ModuleProfile:
    """``node`` and its subtree as :func:`combined_trees` combines them: each tree's node of the
    same name (``indexes``: each tree's nodes by name, and its weight)."""
    same = [(index[node.name], weight) for index, weight in indexes if node.name in index]
    children = [_merged(child, indexes, latency_of) for child in node.children]
    return dataclasses.replace(
        node,
        macs_by_op=_weighted_sum((other.macs_by_op, weight) for other, weight in same),
        elementwise_flops_by_op=_weighted_sum((other.elementwise_flops_by_op, weight) for other, weight in same),
        activations=sum(other.activations * weight for other, weight in same),
        comm_bytes_by_collective=_weighted_sum((other.comm_bytes_by_collective, weight) for other, weight in same),
        int_macs_by_op=_weighted_sum((other.int_macs_by_op, weight) for other, weight in same),
        masked_out_macs=sum(other.masked_out_macs * weight for other, weight in same),
        bytes=sum(other.bytes * weight for other, weight in same),
        predicted_s=None if any(other.predicted_s is None for other, _ in same) else sum(other.predicted_s * weight for other, weight in same),
        called=any(other.called for other, _ in same),
        latency=latency_of(node.name, [other.latency for other, _ in same]) or _sum_of_children(children),
        children=children,
    )
