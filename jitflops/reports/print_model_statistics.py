"""fvcore's printouts of an analysis: ``flop_count_str`` (the model's repr, annotated) and
``flop_count_table``. They read the analyses and never change their settings."""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional

from torch import nn

from ..engine.activation_count import ActivationCountAnalysis
from ..estimates.byte_count import ByteCountAnalysis
from ..engine.flop_count import FlopCountAnalysis
from .formatting import format_quantity, format_seconds, format_size
from ..engine.parameter_count import parameter_count
from ..core.table import pipe_table
from ..timing.timed_pass import LatencyStats

LATENCY_COLUMN, RATE_COLUMN = "#latency", "#FLOP/s"

ModuleStats = dict[str, dict[str, str]]


def _group_by_module(statistics: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{statistic: {module: value}}`` -> ``{module: {statistic: value}}`` (fvcore's helper)."""
    grouped: dict[str, dict[str, Any]] = {}
    for statistic, values in statistics.items():
        for module, value in values.items():
            grouped.setdefault(module, {})[statistic] = value
    return grouped


def _fill_missing_statistics(model: nn.Module, statistics: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """Every statistic gets a 0 for each of the model's modules it lacks (fvcore's helper)."""
    filled = {statistic: dict(values) for statistic, values in statistics.items()}
    for name, _ in model.named_modules():
        for values in filled.values():
            values.setdefault(name, 0)
    return filled


def _children(name: str, names: Mapping[str, object]) -> list[str]:
    prefix = name + "." if name else ""
    depth = prefix.count(".")
    return [child for child in names if child and child.startswith(prefix) and child.count(".") == depth]


def _remove_zero_statistics(
    statistics: Mapping[str, Mapping[str, int]], force_keep: Optional[set[str]] = None, require_trivial_children: bool = False
) -> dict[str, dict[str, int]]:
    """Modules whose every statistic is zero are dropped, except the root, those in ``force_keep``
    and, with ``require_trivial_children``, those with a kept descendant (fvcore's helper; fvcore
    also drops an all-zero root)."""
    kept: dict[str, dict[str, int]] = {}
    _keep_nonzero("", statistics, force_keep or set(), require_trivial_children, kept)
    return kept


def _keep_nonzero(name: str, statistics: Mapping[str, Mapping[str, int]], keep: set[str], require_trivial_children: bool, kept: dict[str, dict[str, int]]) -> bool:
    """Whether ``name``'s row is kept (after its children's, into ``kept``), by :func:`_remove_zero_statistics`' rule."""
    child_kept = [_keep_nonzero(child, statistics, keep, require_trivial_children, kept) for child in _children(name, statistics)]
    keep_row = name == "" or name in keep or any(value != 0 for value in statistics[name].values())
    keep_row = keep_row or (require_trivial_children and any(child_kept))
    if keep_row:
        kept[name] = dict(statistics[name])
    return keep_row


def _pretty_statistics(statistics: Mapping[str, Mapping[str, int]], sig_figs: int = 3, hide_zero: bool = False) -> ModuleStats:
    """Every value in fvcore's compact format (fvcore's helper)."""
    return {name: {column: format_size(value, sig_figs, hide_zero) for column, value in row.items()} for name, row in statistics.items()}


def _indicate_uncalled_modules(
    statistics: ModuleStats, stat_name: str, uncalled_modules: set[str], uncalled_indicator: str = "N/A"
) -> ModuleStats:
    """A copy with ``stat_name`` of every uncalled module replaced by ``uncalled_indicator`` (fvcore's helper)."""
    marked = {name: dict(row) for name, row in statistics.items()}
    for name in uncalled_modules:
        marked.setdefault(name, {})[stat_name] = uncalled_indicator
    return marked


MASKED_COLUMN = "#flops (masks followed)"
BYTES_COLUMN, INTENSITY_COLUMN = "#bytes", "#FLOP/byte"


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


def _model_stats_str(model: nn.Module, stats: ModuleStats) -> str:
    """``str(model)`` with each module's statistics as an extra line, as fvcore prints it."""
    return _module_repr(model, "", stats)


def _module_repr(module: nn.Module, name: str, stats: ModuleStats) -> str:
    """``repr(module)`` (``name`` in the model) with its statistics added to its extra_repr."""
    extra_lines = module.extra_repr().split("\n") if module.extra_repr() else []
    if name in stats:
        printed = ", ".join(f"{column}: {value}" for column, value in stats[name].items())
        extra_lines.extend(printed.split("\n") if printed else [])
    child_lines = []
    for key, child in module._modules.items():
        if child is not None:
            first, *rest = _module_repr(child, f"{name}.{key}" if name else key, stats).split("\n")
            child_lines.append(f"({key}): " + "\n".join([first] + ["  " + line for line in rest]))
    lines = extra_lines + child_lines
    text = module._get_name() + "("
    if lines:
        text += extra_lines[0] if len(extra_lines) == 1 and not child_lines else "\n  " + "\n  ".join(lines) + "\n"
    return text + ")"


UNCALLED_LEGEND = (
    "N/A indicates a possibly missing statistic due to how the module was called. "
    "Missing values are still included in the parent's total."
)
"""fvcore's line above a printout with N/A entries."""


def flop_count_str(
    flops: FlopCountAnalysis,
    activations: Optional[ActivationCountAnalysis] = None,
    latency: Optional[Mapping[str, LatencyStats]] = None,
    show_shapes: bool = False,
) -> str:
    """The model's ``repr`` with ``#params`` and ``#flops`` (and ``#acts``) on every module.

    Modules whose statistics are all zero are left out; modules never called show ``N/A``. With
    ``latency`` (``time_model(...).modules``), each module also shows its median latency and
    achieved FLOP/s; with ``show_shapes``, its output shapes (JIT backend).
    """
    model = flops._model
    columns = {"#params": dict(parameter_count(model))}
    columns.update(_analysis_columns(flops, activations, "#flops", "#acts"))
    flops_uncalled = flops.uncalled_modules(emit_warnings=False)
    acts_uncalled = activations.uncalled_modules(emit_warnings=False) if activations is not None else set()
    stats = _remove_zero_statistics(_group_by_module(_fill_missing_statistics(model, columns)), force_keep=flops_uncalled | acts_uncalled)
    printed = _indicate_uncalled_modules(_pretty_statistics(stats, sig_figs=2), "#flops", flops_uncalled)
    if activations is not None:
        printed = _indicate_uncalled_modules(printed, "#acts", acts_uncalled)
    if show_shapes:
        _add_output_shapes(printed, flops)
    _add_latency(printed, columns["#flops"], latency)
    legend = UNCALLED_LEGEND + "\n" if flops_uncalled | acts_uncalled else ""
    return legend + _model_stats_str(model, printed)


def _get_single_child(name: str, stats: Mapping[str, object]) -> Optional[str]:
    children = _children(name, stats)
    return children[0] if len(children) == 1 else None


def _try_combine(row: dict[str, str], child_row: dict[str, str]) -> Optional[dict[str, str]]:
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


def _fastforward(name: str, stats: ModuleStats) -> tuple[str, dict[str, str]]:
    """Follow chains of single children with the same statistics, so they print as one row."""
    row = stats[name]
    child = _get_single_child(name, stats)
    while child is not None:
        merged = _try_combine(row, stats[child])
        if merged is None:
            break
        name, row = child, merged
        child = _get_single_child(name, stats)
    return name, row


def _model_stats_table(stats: ModuleStats, max_depth: int = 3, stat_columns: Optional[list[str]] = None) -> str:
    columns = stat_columns if stat_columns is not None else list(dict.fromkeys(column for row in stats.values() for column in row))
    root_name, root_row = _fastforward("", stats)
    root_prefix = root_name + "." if root_name else ""
    rows = []
    for depth, name, row in [(0, root_name or "model", root_row), *_rows_below(root_name, stats, 1, max_depth)]:
        shown = name[len(root_prefix):] if depth and root_prefix and name.startswith(root_prefix) else name
        pad = " " * depth
        rows.append([pad + shown] + [pad + row[column] if column in row else "" for column in columns])
    return pipe_table(rows, headers=["module"] + columns)


def _rows_below(parent: str, stats: ModuleStats, depth: int, max_depth: int) -> Iterator[tuple[int, str, dict[str, str]]]:
    """Each module under ``parent`` down to ``max_depth``, depth first, with its depth and row
    (a chain of single children is shown as one row, :func:`_fastforward`)."""
    if depth > max_depth:
        return
    for child in _children(parent, stats):
        name, row = _fastforward(child, stats)
        yield depth, name, row
        yield from _rows_below(name, stats, depth + 1, max_depth)


OUTPUT_SHAPE = "output shape"


def _shapes_text(shapes: list[tuple[int, ...]]) -> str:
    shown = ", ".join(str(list(shape)) for shape in shapes[:2])
    return shown + (f" (+{len(shapes) - 2})" if len(shapes) > 2 else "")


def _add_output_shapes(rows: dict[str, dict[str, str]], flops: FlopCountAnalysis) -> list[str]:
    """Each module row gets its output shapes; the column name, for the table's column list."""
    shapes = flops.output_shapes()
    for name, row in rows.items():
        row[OUTPUT_SHAPE] = _shapes_text(shapes.get(name, []))
    return [OUTPUT_SHAPE]


def _in_execution_order(printed: ModuleStats, flops: FlopCountAnalysis) -> ModuleStats:
    """The rows with modules in the order the trace met them; each module's parameter rows stay
    right after it, modules the trace did not meet keep their place after the others."""
    ran = [name for scope in flops.scoped_trace().scopes() for name in scope.split("/")]
    rank = {name: index for index, name in enumerate(dict.fromkeys(ran))}
    position = {name: index for index, name in enumerate(printed)}
    return dict(sorted(printed.items(), key=lambda item: (rank.get(item[0], len(rank)), position[item[0]])))


def flop_count_table(
    flops: FlopCountAnalysis,
    max_depth: int = 3,
    activations: Optional[ActivationCountAnalysis] = None,
    show_param_shapes: bool = True,
    show_convention: bool = True,
    latency: Optional[Mapping[str, LatencyStats]] = None,
    module_order: str = "fvcore",
    show_shapes: bool = False,
    masked_attention: bool = False,
    traffic: bool = False,
) -> str:
    """Parameters and flops (and activations) per module, as a table down to ``max_depth``.

    With ``show_param_shapes``, parameters appear as rows with their shapes. With
    ``show_convention``, a last line says what was counted. With ``latency``
    (``time_model(...).modules``), two more columns: median latency and achieved FLOP/s.
    ``module_order``: ``"fvcore"`` lists modules with parameters first, as fvcore does;
    ``"execution"`` lists siblings in the order the forward ran them (modules that ran no op last).
    ``show_shapes`` adds each module's output shapes (JIT backend), as torchinfo does.
    ``masked_attention`` adds the mask-aware count beside (``#flops (masks followed)``: attention
    counted by the (query, key) pairs its masks keep, from the same recording). ``traffic`` adds the
    bytes each module's ops read and write (:class:`~jitflops.ByteCountAnalysis`, same recording)
    and their arithmetic intensity (FLOPs, 2 x #flops, per byte).
    """
    params_column = "#parameters" + (" or shape" if show_param_shapes else "")
    model = flops._model
    columns = {params_column: {"": 0, **parameter_count(model)}}  # a model without parameters shows 0
    columns.update(_analysis_columns(flops, activations, "#flops", "#activations"))
    if masked_attention:
        columns[MASKED_COLUMN] = dict(flops.masked_attention().by_module(emit_warnings=False))
    if traffic:
        columns[BYTES_COLUMN] = dict(flops.of_same_recording(ByteCountAnalysis).by_module(emit_warnings=False))
    stats = _remove_zero_statistics(_group_by_module(columns), require_trivial_children=True)
    printed = _pretty_statistics(stats)
    printed = _indicate_uncalled_modules(printed, "#flops", flops.uncalled_modules(emit_warnings=False) & printed.keys(), "")
    if activations is not None:
        printed = _indicate_uncalled_modules(printed, "#activations", activations.uncalled_modules(emit_warnings=False) & printed.keys(), "")
    parameter_shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for name in parameter_shapes.keys() & printed.keys():
        if show_param_shapes:
            printed[name][params_column] = str(parameter_shapes[name])
        else:
            del printed[name]
    modules = {name: row for name, row in printed.items() if name not in parameter_shapes}
    shape_columns = _add_output_shapes(modules, flops) if show_shapes else []
    latency_columns = _add_latency(modules, columns["#flops"], latency)
    if traffic:
        for name, row in modules.items():
            moved = columns[BYTES_COLUMN].get(name, 0)
            row[INTENSITY_COLUMN] = f"{2 * columns['#flops'].get(name, 0) / moved:.3g}" if moved else ""
        latency_columns.append(INTENSITY_COLUMN)
    if module_order == "execution":
        printed = _in_execution_order(printed, flops)
    elif module_order != "fvcore":
        raise ValueError(f"module_order must be 'fvcore' or 'execution', got {module_order!r}")
    table = _model_stats_table(printed, max_depth, list(columns) + shape_columns + latency_columns)
    if show_convention:
        table += f"\n\nCounting convention: {flops.convention()}"
        if masked_attention:
            table += f"; {MASKED_COLUMN}: attention by the pairs its masks keep"
    return table
