"""One hierarchy: every module with its parameters, MACs per op, activations and latency.

Built from the analyses (counts by trace) and a timed pass (latency), keyed by the same canonical
module names, so every printout and export reads one tree. A module reachable by several names (a
shared module) appears once, under its canonical name.
"""

from __future__ import annotations

import typing
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Optional, Sequence

from torch import nn

from .activation_count import ActivationCountAnalysis
from .jit_analysis import module_aliases
from .flop_count import FlopCountAnalysis
from .handles import ELEMENTWISE_FLOP_FORMULAS, short_op_name
from .parameter_count import parameter_count
from .timing import LatencyStats


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

    @property
    def macs(self) -> int:
        return sum(self.macs_by_op.values())

    @property
    def flops(self) -> int:
        return 2 * self.macs + sum(self.elementwise_flops_by_op.values())

    @property
    def flops_per_second(self) -> Optional[float]:
        """Achieved FLOP/s: this module's FLOPs over its median latency."""
        if self.latency is None or self.latency.median <= 0:
            return None
        return self.flops / self.latency.median

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


def _remove_ignored(node: ModuleProfile, ignored: tuple[type, ...], type_of: dict[str, type], ancestors: list[ModuleProfile]) -> None:
    """Drop modules of the ignored types, and take their cost out of every ancestor."""
    kept = []
    for child in node.children:
        if issubclass(type_of[child.name], ignored):
            for ancestor in ancestors + [node]:
                ancestor.macs_by_op = +(ancestor.macs_by_op - child.macs_by_op)
                ancestor.elementwise_flops_by_op = +(ancestor.elementwise_flops_by_op - child.elementwise_flops_by_op)
                ancestor.activations -= child.activations
                ancestor.latency = _subtract(ancestor.latency, child.latency)
        else:
            _remove_ignored(child, ignored, type_of, ancestors + [node])
            kept.append(child)
    node.children = kept


def build_hierarchy(
    model: nn.Module,
    flops: FlopCountAnalysis,
    activations: Optional[ActivationCountAnalysis] = None,
    latency: Optional[Mapping[str, LatencyStats]] = None,
    ignore_modules: Sequence[type] = (),
) -> ModuleProfile:
    """The model's module tree with counts and latency (seconds per canonical module name) attached.

    Modules of a type in ``ignore_modules`` are left out and their MACs, activations and latency
    are removed from their ancestors too (parameters stay: they are still in the model).
    """
    aliases = module_aliases(model)
    params = parameter_count(model)
    macs = flops.by_module_and_operator()
    acts = activations.by_module(emit_warnings=False) if activations is not None else Counter()
    uncalled = flops.uncalled_modules(emit_warnings=False)
    latency = latency or {}
    type_of: dict[str, type] = {}
    elementwise_keys = {short_op_name(kind) for kind in ELEMENTWISE_FLOP_FORMULAS.kinds()}

    def build(module: nn.Module, name: str, depth: int) -> ModuleProfile:
        type_of[name] = type(module)
        node = ModuleProfile(
            name=name,
            type_name=type(module).__name__,
            depth=depth,
            params=params.get(name, 0),
            macs_by_op=Counter({op: n for op, n in macs.get(name, {}).items() if op not in elementwise_keys}),
            elementwise_flops_by_op=Counter({op: n for op, n in macs.get(name, {}).items() if op in elementwise_keys}),
            activations=acts.get(name, 0),
            latency=latency.get(name),
            called=name not in uncalled,
            extra_repr=module.extra_repr(),
        )
        for key, child in module.named_children():
            child_name = f"{name}.{key}" if name else key
            if aliases[child] == child_name:  # shared modules live under their canonical name only
                node.children.append(build(child, child_name, depth + 1))
        if node.latency is None and name in uncalled:
            node.latency = _sum_of_children(node.children)
        return node

    root = build(model, "", 0)
    if ignore_modules:
        _remove_ignored(root, tuple(ignore_modules), type_of, [])
    return root
