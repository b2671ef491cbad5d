"""Files: the profile as JSON, the per-op table as CSV, a Chrome/Perfetto trace (the HTML report is
:mod:`jitflops.reports.html_report`).

Every file is written by :func:`jitflops.reports.file_output.write_text`: atomically, through symbolic
links, keeping the file's mode, creating missing directories, and naming the user's path on error.

The JSON document (``"schema": "jitflops.profiling.profile/2"``) holds ``units``, what each field measures
(:data:`UNITS`), ``convention``, what was counted, then ``summary`` (the DeepSpeed summary
figures), ``modules`` (one object per module, parents before children), ``ops`` (the per-op rows,
empty unless the per-op table was asked for) and ``ranks`` (in a multi-process run each rank's own
document; the modules above are then the ranks gathered: counts summed, latency one sample per
rank).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from typing import Any, Optional

from .file_output import write_text
from ..estimates.error_bands import error_band
from ..profiling.hierarchy import ModuleProfile
from ..profiling.op_table import OpRow
from ..profiling.model_profile import ModelProfile
from ..timing.timed_pass import Span

SCHEMA = "jitflops.profiling.profile/2"

UNITS = {
    "params": "parameters (elements)",
    "macs": "multiply-accumulates: one fused multiply-add = 1 MAC (fvcore's 'flop')",
    "flops": "floating-point operations: 2 x macs + elementwise_flops (DeepSpeed's and torch.utils.flop_counter's 'flop')",
    "elementwise_flops": "1 per output element of an elementwise op; 0 unless elementwise ops were counted",
    "backward_macs": "MACs of the backward pass, measured by the dispatch backend (null: not measured)",
    "recompute_macs": "MACs of the forward work recomputed during the backward (activation checkpointing, fused attention kernels' scores), apart from backward_macs (null: not measured)",
    "activations": "elements of the outputs of counted ops",
    "*_latency, latency": "seconds: median_s, mean_s, min_s, max_s, stdev_s, iqr_s over iterations",
    "time_s, *_s": "seconds",
    "*flops_per_second": "flops per second (FLOP/s)",
    "peak_flops": "the device's peak FLOP/s for the model's dtype",
    "mfu": "achieved FLOP/s / peak_flops (a fraction, 0 to 1): the model's FLOPs only",
    "hfu": "hardware FLOPs utilisation: (the model's FLOPs + the forward work recomputed in the backward) / time / peak_flops",
    "memory_*": "bytes",
    "forwards": "forward calls the counts and latencies cover (totals when more than 1)",
    "counted_by": "the front end that recorded the ops: jit (the JIT trace), dispatch (the ops as they ran) or export (the graph torch.export made)",
    "fallback_reason": "why another front end counted where the JIT trace was asked for (null: it did not)",
    "comm_bytes, bytes": "bytes a collective moves, by nccl-tests' size definitions (the gathered output of an all-gather, the input of a reduce-scatter or all-to-all, the tensor of an all-reduce)",
    "bus_bytes": "bytes x nccl-tests' bus factor: 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 for broadcast, send and recv",
    "masked_out_macs": "attention MACs the masks discard (causal, sliding-window, padding): in macs (the dense convention), not in the mask-aware count macs - masked_out_macs",
    "int_macs": "integer multiply-accumulates (IOPs) of quantized and integer products (quantized::linear*, quantized::conv*, _int_mm, int8/int4 weight-only products), apart from macs",
    "cluster_mfu": "the ranks' flops summed / (the slowest rank's time x the sum of the ranks' peak_flops)",
    "bytes (modules, summary)": "bytes the forward's ops read and write, each op as one kernel (ByteCountAnalysis)",
    "intensity": "arithmetic intensity: flops per byte read or written",
    "ridge": "the prediction device's ridge point: the intensity above which an op is compute-bound",
    "bound": "compute or memory: the intensity (the forward's, a module's) against the prediction device's ridge point (efficiency x peak / efficiency x bandwidth)",
    "predicted_s": "seconds predicted on prediction_device: per op its kernel (its family's calibrated curve, or the roofline max(flops / (efficiency x peak), bytes / (efficiency x bandwidth)) + a launch cost) and the host's time of its call, added up by the execution mode",
    "prediction_mode": "the execution mode predicted_s is for: eager, graph (CUDA graphs) or compiled (torch.compile)",
    "predicted_error_band": "the measured error of predicted_s in its mode on the prediction device's class, [low, high] as fractions (null: not measured there)",
    "predicted_to_measured": "predicted_s / the measured median latency (the whole forward's: without the timing hooks; null: not timed, or timed on another device than prediction_device)",
    "measured_on": "the device the timed pass ran on: cpu, or the GPU's name (null: not timed)",
}


def profile_to_dict(profile: ModelProfile) -> dict[str, Any]:
    summary = profile.summary
    return {
        "schema": SCHEMA,
        "units": UNITS,
        "convention": profile.convention,
        "step": profile.step,
        "summary": {
            "model_class": summary.model_class,
            "device": summary.device,
            "world_size": summary.parallel.world,
            "data_parallel_size": summary.parallel.data_parallel,
            "model_parallel_size": summary.parallel.model_parallel,
            "batch_size": summary.batch_size,
            "params": summary.params,
            "forwards": summary.forwards,
            "counted_by": summary.counted_by,
            "fallback_reason": summary.fallback_reason,
            "macs": summary.macs,
            "flops": summary.flops,
            "elementwise_flops": summary.elementwise_flops,
            "backward_macs": summary.backward_macs,
            "recompute_macs": summary.recompute_macs,
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
            "page_faults_per_forward": summary.page_faults,
            "other_cores_while_timed": summary.other_cores,
            "peak_flops": summary.peak_flops,
            "model_flops": summary.model_flops,
            "mfu": summary.mfu,
            "hfu": summary.hfu,
            "int_macs": summary.int_macs,
            "masked_out_macs": summary.masked_out_macs,
            "bytes": summary.bytes,
            "intensity": summary.intensity,
            "prediction_device": None if summary.prediction_device is None else summary.prediction_device.name,
            "ridge": summary.ridge,
            "bound": summary.bound,
            "predicted_s": summary.predicted_s,
            "prediction_mode": summary.prediction_mode if summary.prediction_device is not None else None,
            "predicted_error_band": error_band(summary.prediction_device, summary.prediction_figure) if summary.prediction_device is not None else None,
            "predicted_to_measured": summary.predicted_to_measured,
            "measured_on": summary.measured_on,
            "comm_bytes": summary.comm_bytes,
            "collectives": [totals.as_dict() for totals in summary.collectives],
            "slowest_rank": profile.slowest_rank,
    "cluster_mfu": profile.cluster_mfu,
        },
        "modules": [_module_to_dict(node, node.mfu(profile.tree_peak_flops), summary.ridge) for node in profile.root.walk()],
        "ops": [row.as_dict() for row in profile.op_rows],
        "ranks": [profile_to_dict(rank) for rank in profile.ranks],
        "generation": None if profile.generation is None else {
            "steps": [dataclasses.asdict(step) for step in profile.generation.steps],
            "macs_per_generated_token": profile.generation.macs_per_generated_token,
            "kv_cache_share": profile.generation.kv_cache_share,
        },
    }


def _module_to_dict(node: ModuleProfile, mfu: Optional[float], ridge: Optional[float]) -> dict[str, Any]:
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
        "int_macs": node.int_macs,
        "masked_out_macs": node.masked_out_macs,
        "bytes": node.bytes,
        "intensity": node.intensity,
        "bound": node.bound(ridge),
        "predicted_s": node.predicted_s,
        "predicted_to_measured": node.predicted_to_measured,
        "int_macs_by_op": dict(node.int_macs_by_op),
        "comm_bytes": node.comm_bytes,
        "comm_bytes_by_collective": dict(node.comm_bytes_by_collective),
        "called": node.called,
        "latency": node.latency.as_dict() if node.latency else None,
        "flops_per_second": node.flops_per_second,
        "mfu": mfu,
    }


def profile_to_json(profile: ModelProfile) -> str:
    return json.dumps(profile_to_dict(profile), indent=2)


OP_COLUMNS = ("index", "module", "op", "input_shapes", "macs", "flops", "elementwise_flops", "bytes", "intensity", "time_s", "memory_before", "memory_after", "memory_delta")


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


def write_json(profile: ModelProfile, path: str) -> None:
    write_text(path, profile_to_json(profile))


def write_ops_csv(profile: ModelProfile, path: str) -> None:
    write_text(path, ops_to_csv(profile.op_rows))


def write_chrome_trace(profile: ModelProfile, path: str) -> None:
    write_text(path, spans_to_chrome_trace(profile.spans))
