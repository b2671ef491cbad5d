"""fvcore's printouts of an analysis: ``flop_count_str`` (the model's repr, annotated) and
``flop_count_table``. They read the analyses and never change their settings."""

from __future__ import annotations

from typing import Mapping, Optional

from torch import nn

from .activation_count import ActivationCountAnalysis
from .flop_count import FlopCountAnalysis
from .formatting import format_quantity, format_seconds, format_size
from .parameter_count import parameter_count
from .table import pipe_table
from .timing import LatencyStats

LATENCY_COLUMN, RATE_COLUMN = "#latency", "#FLOP/s"

ModuleStats = dict[str, dict[str, str]]


def _by_module(columns: Mapping[str, Mapping[str, int]], names: list[str], fill_missing: bool) -> dict[str, dict[str, int]]:
    """``{column: {module: value}}`` -> ``{module: {column: value}}``; a module missing from a column
    gets 0 there with ``fill_missing``, and no cell otherwise (it prints empty)."""
    return {
        name: {column: values.get(name, 0) for column, values in columns.items() if fill_missing or name in values}
        for name in names
    }


def _children(name: str, names: Mapping[str, object]) -> list[str]:
    prefix = name + "." if name else ""
    depth = prefix.count(".")
    return [child for child in names if child and child.startswith(prefix) and child.count(".") == depth]


def _drop_zero_rows(stats: dict[str, dict[str, int]], keep: set[str], keep_parents_of_kept: bool) -> dict[str, dict[str, int]]:
    """Rows whose every value is zero are dropped, except those in ``keep`` (and, if asked, rows
    with a kept descendant)."""
    kept: dict[str, dict[str, int]] = {}

    def visit(name: str) -> bool:
        child_kept = [visit(child) for child in _children(name, stats)]
        keep_row = name == "" or name in keep or any(value != 0 for value in stats[name].values())
        keep_row = keep_row or (keep_parents_of_kept and any(child_kept))
        if keep_row:
            kept[name] = dict(stats[name])
        return keep_row

    visit("")
    return kept


def _formatted(stats: dict[str, dict[str, int]], sig_figs: int) -> ModuleStats:
    return {name: {column: format_size(value, sig_figs) for column, value in row.items()} for name, row in stats.items()}


def _mark(stats: ModuleStats, column: str, modules: set[str], indicator: str) -> None:
    for name in modules & stats.keys():
        stats[name][column] = indicator


def _analysis_columns(flops: FlopCountAnalysis, activations: Optional[ActivationCountAnalysis], flops_name: str, acts_name: str) -> dict[str, dict[str, int]]:
    columns = {flops_name: dict(flops.by_module(emit_warnings=False))}
    if activations is not None:
        columns[acts_name] = dict(activations.by_module(emit_warnings=False))
    return columns


def _add_latency(printed: ModuleStats, flops_by_module: Mapping[str, int], latency: Optional[Mapping[str, LatencyStats]]) -> list[str]:
    """Median latency and achieved FLOP/s (2 x #flops / latency: a multiply-add is two FLOPs on the
    hardware) beside the counts; empty where a module was not timed."""
    if latency is None:
        return []
    for name, row in printed.items():
        stats = latency.get(name)
        row[LATENCY_COLUMN] = format_seconds(stats.median) if stats else ""
        rate = 2 * flops_by_module.get(name, 0) / stats.median if stats and stats.median > 0 else None
        row[RATE_COLUMN] = format_quantity(rate) if rate else ""
    return [LATENCY_COLUMN, RATE_COLUMN]


def _repr_with_statistics(model: nn.Module, stats: ModuleStats) -> str:
    """``str(model)`` with each module's statistics as an extra line, as fvcore prints it."""

    def indent(text: str) -> str:
        first, *rest = text.split("\n")
        return "\n".join([first] + ["  " + line for line in rest])

    def render(module: nn.Module, name: str) -> str:
        extra_lines = module.extra_repr().split("\n") if module.extra_repr() else []
        if name in stats:
            printed = ", ".join(f"{column}: {value}" for column, value in stats[name].items())
            extra_lines.extend(printed.split("\n") if printed else [])
        child_lines = []
        for key, child in module._modules.items():
            if child is not None:
                child_lines.append(f"({key}): " + indent(render(child, f"{name}.{key}" if name else key)))
        lines = extra_lines + child_lines
        text = module._get_name() + "("
        if lines:
            text += extra_lines[0] if len(extra_lines) == 1 and not child_lines else "\n  " + "\n  ".join(lines) + "\n"
        return text + ")"

    return render(model, "")


UNCALLED_LEGEND = (
    "N/A indicates a possibly missing statistic due to how the module was called. "
    "Missing values are still included in the parent's total."
)
"""fvcore's line above a printout with N/A entries."""


def flop_count_str(
    flops: FlopCountAnalysis,
    activations: Optional[ActivationCountAnalysis] = None,
    latency: Optional[Mapping[str, LatencyStats]] = None,
) -> str:
    """The model's ``repr`` with ``#params`` and ``#flops`` (and ``#acts``) on every module.

    Modules whose statistics are all zero are left out; modules never called show ``N/A``. With
    ``latency`` (``time_model(...).modules``), each module also shows its median latency and
    achieved FLOP/s.
    """
    model = flops._model
    columns = {"#params": dict(parameter_count(model))}
    columns.update(_analysis_columns(flops, activations, "#flops", "#acts"))
    flops_uncalled = flops.uncalled_modules(emit_warnings=False)
    acts_uncalled = activations.uncalled_modules(emit_warnings=False) if activations is not None else set()
    stats = _by_module(columns, list(dict(model.named_modules())), fill_missing=True)
    printed = _formatted(_drop_zero_rows(stats, keep=flops_uncalled | acts_uncalled, keep_parents_of_kept=False), sig_figs=2)
    _mark(printed, "#flops", flops_uncalled, "N/A")
    if activations is not None:
        _mark(printed, "#acts", acts_uncalled, "N/A")
    _add_latency(printed, columns["#flops"], latency)
    legend = UNCALLED_LEGEND + "\n" if flops_uncalled | acts_uncalled else ""
    return legend + _repr_with_statistics(model, printed)


def _single_child(name: str, stats: Mapping[str, object]) -> Optional[str]:
    children = _children(name, stats)
    return children[0] if len(children) == 1 else None


def _merged(row: dict[str, str], child_row: dict[str, str]) -> Optional[dict[str, str]]:
    """One row for a module and its only child, if their values agree (or one side is empty)."""
    if row.keys() != child_row.keys():
        return None
    merged = {}
    for column, value in row.items():
        other = child_row[column]
        if value and other and value != other:
            return None
        merged[column] = value or other
    return merged


def _fast_forward(name: str, stats: ModuleStats) -> tuple[str, dict[str, str]]:
    """Follow chains of single children with the same statistics, so they print as one row."""
    row = stats[name]
    child = _single_child(name, stats)
    while child is not None:
        merged = _merged(row, stats[child])
        if merged is None:
            break
        name, row = child, merged
        child = _single_child(name, stats)
    return name, row


def _statistics_table(stats: ModuleStats, max_depth: int, columns: list[str]) -> str:
    rows: list[list[str]] = []

    def add_row(name: str, row: dict[str, str], depth: int, shown_name: str) -> None:
        pad = " " * depth
        rows.append([pad + shown_name] + [pad + row[column] if column in row else "" for column in columns])

    root_name, root_row = _fast_forward("", stats)
    add_row(root_name, root_row, 0, root_name or "model")
    root_prefix = root_name + "." if root_name else ""

    def fill(depth: int, parent: str) -> None:
        if depth > max_depth:
            return
        for child in _children(parent, stats):
            name, row = _fast_forward(child, stats)
            shown = name[len(root_prefix):] if root_prefix and name.startswith(root_prefix) else name
            add_row(name, row, depth, shown)
            fill(depth + 1, name)

    fill(1, root_name)
    return pipe_table(rows, headers=["module"] + columns)


def flop_count_table(
    flops: FlopCountAnalysis,
    max_depth: int = 3,
    activations: Optional[ActivationCountAnalysis] = None,
    show_param_shapes: bool = True,
    show_convention: bool = True,
    latency: Optional[Mapping[str, LatencyStats]] = None,
) -> str:
    """Parameters and flops (and activations) per module, as a table down to ``max_depth``.

    With ``show_param_shapes``, parameters appear as rows with their shapes. With
    ``show_convention``, a last line says what was counted. With ``latency``
    (``time_model(...).modules``), two more columns: median latency and achieved FLOP/s.
    """
    params_column = "#parameters" + (" or shape" if show_param_shapes else "")
    model = flops._model
    columns = {params_column: dict(parameter_count(model))}
    columns.update(_analysis_columns(flops, activations, "#flops", "#activations"))
    names = list(dict.fromkeys(list(columns[params_column]) + list(dict(model.named_modules()))))
    stats = _drop_zero_rows(_by_module(columns, names, fill_missing=False), keep=set(), keep_parents_of_kept=True)
    printed = _formatted(stats, sig_figs=3)
    _mark(printed, "#flops", flops.uncalled_modules(emit_warnings=False), "")
    if activations is not None:
        _mark(printed, "#activations", activations.uncalled_modules(emit_warnings=False), "")
    parameter_shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for name in parameter_shapes.keys() & printed.keys():
        if show_param_shapes:
            printed[name][params_column] = str(parameter_shapes[name])
        else:
            del printed[name]
    modules = {name: row for name, row in printed.items() if name not in parameter_shapes}
    latency_columns = _add_latency(modules, columns["#flops"], latency)
    table = _statistics_table(printed, max_depth, list(columns) + latency_columns)
    if show_convention:
        table += f"\n\nCounting convention: {flops.convention()}"
    return table
