"""DeepSpeed's three-part profile printout: summary, aggregated profile per depth, detailed tree."""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Optional

from .formatting import format_quantity, format_seconds
from .hierarchy import ModuleProfile
from .profile import ModelProfile, ProfileSummary

_RULE = "-" * 30


def _or_na(value: Optional[float], render: Callable[[float], str]) -> str:
    return "N/A" if value is None else render(value)


def _latency(stats) -> str:
    if stats is None:
        return "N/A"
    spread = f" (IQR {format_seconds(stats.iqr)}, {len(stats.samples)} runs)" if len(stats.samples) > 1 else ""
    return format_seconds(stats.median) + spread


def _backward_macs(summary: ProfileSummary) -> str:
    if summary.backward_macs is None:
        return "N/A (not measured: 2 x fwd assumed, as DeepSpeed does)"
    return f"{format_quantity(summary.backward_macs, 'MACs')} ({summary.backward_to_forward:.2f} x fwd; DeepSpeed assumes 2)"


def _summary_lines(summary: ProfileSummary, step: Optional[int], convention: str) -> list[str]:
    mp = summary.parallel.model_parallel
    rows = [
        ("world size", str(summary.parallel.world)),
        ("data parallel size", str(summary.parallel.data_parallel)),
        ("model parallel size", str(mp)),
        ("batch size per GPU", str(summary.batch_size) if summary.batch_size is not None else "N/A"),
        ("params per GPU", format_quantity(summary.params)),
        ("params of model = params per GPU * mp_size", format_quantity(summary.params * mp)),
        ("fwd MACs per GPU", format_quantity(summary.macs, "MACs")),
        ("fwd flops per GPU", format_quantity(summary.flops)),
        ("fwd flops of model = fwd flops per GPU * mp_size", format_quantity(summary.flops * mp)),
        ("bwd MACs per GPU (measured)", _backward_macs(summary)),
        ("fwd latency", _latency(summary.forward)),
        ("bwd latency", _latency(summary.backward)),
        ("fwd FLOPS per GPU = fwd flops per GPU / fwd latency", _or_na(summary.forward_flops_per_second, lambda v: format_quantity(v, "FLOPS"))),
        ("bwd FLOPS per GPU = bwd flops per GPU / bwd latency" if summary.backward_macs is not None else "bwd FLOPS per GPU = 2 * fwd flops per GPU / bwd latency", _or_na(summary.backward_flops_per_second, lambda v: format_quantity(v, "FLOPS"))),
        ("fwd+bwd FLOPS per GPU = (fwd + bwd flops) / (fwd+bwd latency)", _or_na(summary.forward_backward_flops_per_second, lambda v: format_quantity(v, "FLOPS"))),
        ("step latency", _latency(summary.step)),
        ("iter latency", _or_na(summary.iteration_latency, format_seconds)),
        ("samples/second", _or_na(summary.samples_per_second, lambda v: f"{v:.2f}")),
    ]
    if summary.timing_overhead is not None:
        rows.append(("timing overhead (fwd with hooks / without - 1)", f"{100 * summary.timing_overhead:.1f}%"))
    width = max(len(label) for label, _ in rows) + 2
    header = f"Profile Summary at step {step}:" if step is not None else "Profile Summary:"
    return [
        f"{_RULE} jitflops profile (DeepSpeed format) {_RULE}",
        header,
        "Notations:",
        "data parallel size (dp_size), model parallel size(mp_size),",
        "number of parameters (params), number of multiply-accumulate operations(MACs),",
        "number of floating-point operations (flops), floating-point operations per second (FLOPS),",
        "fwd latency (forward propagation latency), bwd latency (backward propagation latency),",
        "step (weights update latency), iter latency (sum of fwd, bwd and step latency)",
        f"FLOPs are 2 x MACs, as DeepSpeed defines them. Counting convention: {convention}.",
        f"Latency: median over timed runs on {summary.device}.",
        "",
    ] + [f"{label + ':':<{width}}{value}" for label, value in rows]


def _aggregated_lines(root: ModuleProfile, module_depth: int, top_modules: int) -> list[str]:
    """Top modules by params, MACs and latency at each depth, grouped by module type."""
    by_depth: dict[int, list[ModuleProfile]] = defaultdict(list)
    for node in root.walk():
        by_depth[node.depth].append(node)
    deepest = max(by_depth)
    last = deepest if module_depth < 0 else min(module_depth, deepest)
    lines = [
        f"{_RULE} Aggregated Profile per GPU {_RULE}",
        "Top modules in terms of params, MACs or fwd latency at different model depths:",
    ]
    for depth in range(last + 1):
        params: dict[str, int] = defaultdict(int)
        macs: dict[str, int] = defaultdict(int)
        latency: dict[str, float] = defaultdict(float)
        for node in by_depth[depth]:
            params[node.type_name] += node.params
            macs[node.type_name] += node.macs
            latency[node.type_name] += node.latency.median if node.latency else 0.0

        def top(values: dict, render: Callable[[float], str]) -> str:
            ranked = sorted(values.items(), key=lambda item: -item[1])[:top_modules]
            return "{" + ", ".join(f"'{name}': '{render(value)}'" for name, value in ranked) + "}"

        lines += [
            f"depth {depth}:",
            f"    params      - {top(params, format_quantity)}",
            f"    MACs        - {top(macs, lambda v: format_quantity(v, 'MACs'))}",
            f"    fwd latency - {top(latency, format_seconds)}",
        ]
    return lines


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "0.00%"


def _detailed_lines(root: ModuleProfile, module_depth: int) -> list[str]:
    total_latency = root.latency.median if root.latency else 0.0

    def describe(node: ModuleProfile) -> str:
        latency = node.latency.median if node.latency else 0.0
        rate = node.flops_per_second
        return ", ".join(
            [
                format_quantity(node.params),
                f"{_percent(node.params, root.params)} Params",
                format_quantity(node.macs, "MACs"),
                f"{_percent(node.macs, root.macs)} MACs",
                format_seconds(latency),
                f"{_percent(latency, total_latency)} latency",
                format_quantity(rate, "FLOPS") if rate is not None else "N/A FLOPS",
            ]
        )

    def render(node: ModuleProfile, key: str, indent: str) -> list[str]:
        head = f"{indent}({key}): " if key else indent
        lines = [f"{head}{node.type_name}(", f"{indent}  {describe(node)},"]
        if node.extra_repr:
            lines.append(f"{indent}  {node.extra_repr}")
        if module_depth < 0 or node.depth < module_depth:
            for child in node.children:
                lines += render(child, child.name.rpartition(".")[2], indent + "  ")
        lines.append(f"{indent})")
        return lines

    return [
        f"{_RULE} Detailed Profile per GPU {_RULE}",
        "Each module profile is listed after its name in the following order:",
        "params, percentage of total params, MACs, percentage of total MACs, fwd latency, percentage of total fwd latency, fwd FLOPS",
        "",
        "Note: 1. A module can have torch.nn.module or torch.nn.functional to compute logits (e.g. CrossEntropyLoss).",
        "They are not counted as submodules, thus not to be printed out. However they make up the difference between",
        "a parent's MACs (or latency) and the sum of its submodules'.",
        "2. Number of floating-point operations is a theoretical estimation, thus FLOPS computed using that could be",
        "larger than the maximum system throughput.",
        "",
    ] + render(root, "", "")


def format_model_profile(
    profile: ModelProfile,
    module_depth: int = -1,
    top_modules: int = 1,
    detailed: bool = True,
) -> str:
    """The profile as DeepSpeed prints it; ``module_depth`` (-1: all) and ``top_modules`` as there."""
    lines = _summary_lines(profile.summary, profile.step, profile.convention) + [""]
    lines += _aggregated_lines(profile.root, module_depth, top_modules)
    if detailed:
        lines += [""] + _detailed_lines(profile.root, module_depth)
    lines.append("-" * 100)
    return "\n".join(lines)
