"""Parameter counts per module and per parameter, and fvcore's ``parameter_count_table``."""

from __future__ import annotations

import typing
from collections import defaultdict
from typing import Iterator, Mapping

from torch import nn

from ..core.process_groups import compute_numels
from ..core.table import pipe_table


def parameter_count(model: nn.Module) -> typing.DefaultDict[str, int]:
    """Elements per parameter name and per module name; ``""`` is the whole model.

    Shared parameters are counted once, under their first name. A lazy module's parameters that
    are not materialised yet have no size: they count 0. A sharded model's parameters count what
    this rank computes with: its tensor-parallel share (:func:`~jitflops.core.process_groups.compute_numels`).
    """
    counts: typing.DefaultDict[str, int] = defaultdict(int)
    for name, size in compute_numels(model).items():
        parts = name.split(".")
        for depth in range(len(parts) + 1):
            counts[".".join(parts[:depth])] += size
    return counts


def _format_parameters(value: int) -> str:
    for threshold, unit, suffix in ((1e8, 1e9, "G"), (1e5, 1e6, "M"), (1e2, 1e3, "K")):
        if value > threshold:
            return f"{value / unit:.1f}{suffix}"
    return str(value)


def parameter_count_table(model: nn.Module, max_depth: int = 3) -> str:
    """A table of parameter counts per module, down to ``max_depth``, with each parameter's shape."""
    counts = parameter_count(model)
    shapes = {name: tuple(parameter.shape) for name, parameter in model.named_parameters()}
    rows = [("model", _format_parameters(counts[""])), *_table_rows(counts, shapes, 0, "", max_depth)]
    return pipe_table(rows, headers=["name", "#elements or shape"])


def _table_rows(counts: Mapping[str, int], shapes: Mapping[str, tuple[int, ...]], depth: int, prefix: str, max_depth: int) -> Iterator[tuple[str, str]]:
    """The rows under ``prefix``, depth first: a parameter with its shape, a module with its count."""
    if depth >= max_depth:
        return
    for name, value in counts.items():
        if name and name.count(".") == depth and name.startswith(prefix):
            indent = " " * (depth + 1)
            if name in shapes:
                yield indent + name, indent + str(shapes[name])
            else:
                yield indent + name, indent + _format_parameters(value)
                yield from _table_rows(counts, shapes, depth + 1, name + ".", max_depth)
