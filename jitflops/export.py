"""Files: the profile as JSON, the per-op table as CSV, a Chrome/Perfetto trace, an HTML picture.

Every file is written by :func:`jitflops.file_output.write_text`: atomically, through symbolic
links, keeping the file's mode, creating missing directories, and naming the user's path on error.

The JSON document (``"schema": "jitflops.profile/2"``) holds ``units``, what each field measures
(:data:`UNITS`), ``convention``, what was counted, then ``summary`` (the DeepSpeed summary
figures), ``modules`` (one object per module, parents before children), ``ops`` (the per-op rows,
empty unless the per-op table was asked for) and ``ranks`` (in a multi-process run each rank's own
document; the modules above are then the ranks gathered: counts summed, latency one sample per
rank).
"""

from __future__ import annotations

import csv
import html
import io
import json
from typing import Any, Optional

from .file_output import write_text
from .hierarchy import ModuleProfile
from .op_table import OpRow
from .model_profile import ModelProfile
from .timing import Span

SCHEMA = "jitflops.profile/2"

UNITS = {
    "params": "parameters (elements)",
    "macs": "multiply-accumulates: one fused multiply-add = 1 MAC (fvcore's 'flop')",
    "flops": "floating-point operations: 2 x macs + elementwise_flops (DeepSpeed's and torch.utils.flop_counter's 'flop')",
    "elementwise_flops": "1 per output element of an elementwise op; 0 unless elementwise ops were counted",
    "backward_macs": "MACs of the backward pass, measured by the dispatch backend (null: not measured)",
    "activations": "elements of the outputs of counted ops",
    "*_latency, latency": "seconds: median_s, mean_s, min_s, max_s, stdev_s, iqr_s over iterations",
    "time_s, *_s": "seconds",
    "*flops_per_second": "flops per second (FLOP/s)",
    "peak_flops": "the device's peak FLOP/s for the model's dtype",
    "mfu": "achieved FLOP/s / peak_flops (a fraction, 0 to 1)",
    "memory_*": "bytes",
    "forwards": "forward calls the counts and latencies cover (totals when more than 1)",
}


def profile_to_dict(profile: ModelProfile) -> dict[str, Any]:
    summary = profile.summary
    return {
        "schema": SCHEMA,
        "units": UNITS,
        "convention": profile.convention,
        "step": profile.step,
        "summary": {
            "device": summary.device,
            "world_size": summary.parallel.world,
            "data_parallel_size": summary.parallel.data_parallel,
            "model_parallel_size": summary.parallel.model_parallel,
            "batch_size": summary.batch_size,
            "params": summary.params,
            "forwards": summary.forwards,
            "macs": summary.macs,
            "flops": summary.flops,
            "elementwise_flops": summary.elementwise_flops,
            "backward_macs": summary.backward_macs,
            "backward_flops": summary.backward_flops if summary.backward_macs is not None else None,
            "backward_to_forward": summary.backward_to_forward,
            "forward_latency": summary.forward.as_dict() if summary.forward else None,
            "backward_latency": summary.backward.as_dict() if summary.backward else None,
            "step_latency": summary.step.as_dict() if summary.step else None,
            "iteration_latency_s": summary.iteration_latency,
            "forward_flops_per_second": summary.forward_flops_per_second,
            "backward_flops_per_second": summary.backward_flops_per_second,
            "forward_backward_flops_per_second": summary.forward_backward_flops_per_second,
            "samples_per_second": summary.samples_per_second,
            "timing_overhead": summary.timing_overhead,
            "peak_flops": summary.peak_flops,
            "mfu": summary.mfu,
        },
        "modules": [_module_to_dict(node, summary.peak_flops) for node in profile.root.walk()],
        "ops": [row.as_dict() for row in profile.op_rows],
        "ranks": [profile_to_dict(rank) for rank in profile.ranks],
    }


def _module_to_dict(node: ModuleProfile, peak_flops: Optional[float]) -> dict[str, Any]:
    return {
        "name": node.name,
        "type": node.type_name,
        "depth": node.depth,
        "params": node.params,
        "macs": node.macs,
        "flops": node.flops,
        "elementwise_flops": node.elementwise_flops,
        "macs_by_op": dict(node.macs_by_op),
        "elementwise_flops_by_op": dict(node.elementwise_flops_by_op),
        "activations": node.activations,
        "called": node.called,
        "latency": node.latency.as_dict() if node.latency else None,
        "flops_per_second": node.flops_per_second,
        "mfu": node.flops_per_second / peak_flops if node.flops_per_second is not None and peak_flops else None,
    }


def profile_to_json(profile: ModelProfile) -> str:
    return json.dumps(profile_to_dict(profile), indent=2)


OP_COLUMNS = ("index", "module", "op", "input_shapes", "macs", "flops", "elementwise_flops", "time_s", "memory_before", "memory_after", "memory_delta")


def ops_to_csv(rows: tuple[OpRow, ...] | list[OpRow]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=OP_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        record = row.as_dict()
        record["input_shapes"] = json.dumps(record["input_shapes"])
        writer.writerow(record)
    return buffer.getvalue()


def spans_to_chrome_trace(spans: tuple[Span, ...], process_name: str = "jitflops timed pass") -> str:
    """One complete ("X") event per module call, in microseconds, nested by time: load it in
    ``chrome://tracing`` or https://ui.perfetto.dev."""
    events: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": process_name}}]
    for span in spans:
        events.append(
            {
                "name": span.module or "model",
                "cat": "module",
                "ph": "X",
                "pid": 0,
                "tid": 0,
                "ts": span.start * 1e6,
                "dur": (span.end - span.start) * 1e6,
                "args": {"module": span.module, "depth": span.depth},
            }
        )
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms"})


def _colour(share: float) -> str:
    """Light yellow (low) to dark red (high) for a share in [0, 1]."""
    share = min(1.0, max(0.0, share))
    red, green, blue = 255, int(237 - 200 * share), int(160 - 140 * share)
    return f"rgb({red},{green},{blue})"


def profile_to_html(profile: ModelProfile, colour_by: str = "flops_per_second") -> str:
    """A self-contained HTML page: the module tree as an icicle chart (SVG).

    Each module is a box whose width is its share of its parent's FLOPs (modules without FLOPs get
    a sliver) and whose colour is its achieved FLOP/s relative to the best module
    (``colour_by="flops_per_second"``) or its share of the forward latency (``"latency"``).
    Hovering a box shows its figures.
    """
    if colour_by not in ("flops_per_second", "latency"):
        raise ValueError(f"colour_by must be 'flops_per_second' or 'latency', got {colour_by!r}")
    root = profile.root
    width, row_height = 1200.0, 28.0
    best_rate = max((node.flops_per_second or 0.0 for node in root.walk()), default=0.0) or 1.0
    total_latency = root.latency.median if root.latency else 0.0
    boxes: list[str] = []

    def share(node: ModuleProfile) -> float:
        if colour_by == "latency":
            return (node.latency.median / total_latency) if node.latency and total_latency else 0.0
        return (node.flops_per_second or 0.0) / best_rate

    def draw(node: ModuleProfile, x: float, span: float) -> None:
        latency = f"{node.latency.median * 1e3:.3f} ms" if node.latency else "not timed"
        rate = f"{node.flops_per_second / 1e9:.2f} GFLOP/s" if node.flops_per_second else "n/a"
        title = html.escape(f"{node.name or 'model'} ({node.type_name})\nFLOPs {node.flops:,}  params {node.params:,}\nlatency {latency}  achieved {rate}")
        label = html.escape((node.name.rpartition(".")[2] or "model") if span > 40 else "")
        y = node.depth * row_height
        boxes.append(
            f'<g><title>{title}</title><rect x="{x:.2f}" y="{y:.1f}" width="{max(span - 1, 0.5):.2f}" height="{row_height - 2}" '
            f'fill="{_colour(share(node))}" stroke="#555" stroke-width="0.3"/>'
            f'<text x="{x + 3:.2f}" y="{y + 18:.1f}" font-size="11">{label}</text></g>'
        )
        weights = [max(child.flops, 0) for child in node.children]
        total = sum(weights)
        sliver = span * 0.02 / max(len(node.children), 1)
        widths = [(span - sliver * weights.count(0)) * w / total if total and w else sliver for w in weights]
        offset = x
        for child, child_span in zip(node.children, widths):
            draw(child, offset, child_span)
            offset += child_span

    draw(root, 0.0, width)
    depth = max(node.depth for node in root.walk()) + 1
    legend = "achieved FLOP/s relative to the fastest module" if colour_by == "flops_per_second" else "share of forward latency"
    summary = profile.summary
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>jitflops profile</title>"
        "<style>body{font-family:sans-serif;margin:16px} svg text{pointer-events:none}</style></head><body>"
        f"<h2>{html.escape(root.type_name)}: {summary.macs:,} MACs, {summary.flops:,} FLOPs, {summary.params:,} params</h2>"
        f"<p>Box width: share of the parent's FLOPs. Colour (yellow to red): {legend}. "
        f"Counting convention: {html.escape(profile.convention)}.</p>"
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{depth * row_height:.0f}">{"".join(boxes)}</svg>'
        "</body></html>"
    )


def write_json(profile: ModelProfile, path: str) -> None:
    write_text(path, profile_to_json(profile))


def write_ops_csv(profile: ModelProfile, path: str) -> None:
    write_text(path, ops_to_csv(profile.op_rows))


def write_chrome_trace(profile: ModelProfile, path: str) -> None:
    write_text(path, spans_to_chrome_trace(profile.spans))


def write_html(profile: ModelProfile, path: str, colour_by: str = "flops_per_second") -> None:
    write_text(path, profile_to_html(profile, colour_by))
