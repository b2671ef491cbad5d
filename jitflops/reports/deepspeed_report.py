"""DeepSpeed's three-part profile printout: summary, aggregated profile per depth, detailed tree.

Section titles, ``label: value`` lines (labels padded as DeepSpeed pads them) and number formats
are DeepSpeed's, so that scripts which parse DeepSpeed's printout (``fwd latency:``,
``fwd FLOPS per GPU = ...:``, ``data parallel size:``) read this one. Lines DeepSpeed does not have
(measured backward MACs, MFU, timing overhead) come after DeepSpeed's in the summary.
"""

from __future__ import annotations

import mmap
from collections import defaultdict
from typing import Callable, Optional

from .formatting import deepspeed_bytes, deepspeed_flops, deepspeed_macs, deepspeed_number, deepspeed_params, deepspeed_seconds
from ..profiling.hierarchy import ModuleProfile
from ..estimates.error_bands import error_note
from ..estimates.memory_estimate import CATEGORIES, MemoryEstimate
from ..profiling.model_profile import ModelProfile, ProfileSummary

_LINE = "{:<70}  {:<8}"
SUMMARY_TITLE = "-------------------------- DeepSpeed Flops Profiler --------------------------"
AGGREGATED_TITLE = "----------------------------- Aggregated Profile per GPU -----------------------------"
DETAILED_TITLE = "------------------------------ Detailed Profile per GPU ------------------------------"
TINY_FORWARD_S = 1e-4
"""Below this forward time a timing overhead ratio says nothing about the model."""
FAULTS_WORTH_A_NOTE = 2**20
"""Bytes of fresh pages a forward faults in, past which the printout says why (a MiB: 256 pages,
0.2 ms of the kernel's work at 0.8 µs a page)."""
OTHER_CORES_WORTH_A_NOTE = 0.25
"""Cores other processes kept busy while a forward was timed, past which the printout says what
that does (a quarter of a core: a process at work a quarter of the time; a sweep's 1.4 cores
made a 2-core VM's Python 1.7 to 2.1 times slower, :mod:`jitflops.timing.machine_load`)."""
_END = "------------------------------------------------------------------------------"


def _line(label: str, value: object) -> str:
    return _LINE.format(label + ": ", str(value)).rstrip()


def _seconds(value: Optional[float]) -> str:
    return "N/A" if value is None else deepspeed_seconds(value)


def _rate(value: Optional[float]) -> str:
    return "N/A" if value is None else deepspeed_flops(value)


def _communication_lines(summary: ProfileSummary) -> list[str]:
    """One line per collective this rank ran: calls, bytes (nccl-tests' size), bus bytes, group sizes."""
    return [
        _line(
            f"comm per GPU: {totals.name}",
            f"{totals.calls} calls, {deepspeed_bytes(totals.bytes)}, bus {deepspeed_bytes(totals.bus_bytes)}, "
            f"group size {'/'.join(map(str, totals.group_sizes))}",
        )
        for totals in summary.collectives
    ]


def _generation_lines(profile: ModelProfile) -> list[str]:
    """A generate() profile's prefill and decode steps apart."""
    generation = profile.generation
    if generation is None:
        return []
    lines = [_line(f"prefill MACs ({generation.prefill.tokens} tokens)", deepspeed_macs(generation.prefill.macs))]
    lines += [
        _line(f"decode step {index} MACs (1 token over {step.positions} positions)", deepspeed_macs(step.macs))
        for index, step in enumerate(generation.decode, 1)
    ]
    lines.append(_line("MACs per generated token (prefill included)", deepspeed_macs(generation.macs_per_generated_token)))
    if generation.decode:
        lines.append(_line("KV cache share of the decode MACs (attention over the cache)", f"{100 * generation.kv_cache_share:.2f}%"))
    return lines


def _cluster_lines(profile: ModelProfile) -> list[str]:
    """The run's figures over its ranks: the slowest rank and the cluster's MFU."""
    slowest = profile.slowest_rank
    if slowest is None:
        return []
    seconds = profile.ranks[slowest].summary.measured_work[1]
    lines = [_line("slowest rank (fwd+bwd latency where timed, else fwd)", f"{slowest}: {deepspeed_seconds(seconds)}")]
    if profile.cluster_mfu is not None:
        lines.append(_line("cluster MFU = sum of ranks' flops / (slowest rank's latency * sum of peaks)", f"{100 * profile.cluster_mfu:.2f}%"))
    return lines


def _roofline_lines(summary: ProfileSummary) -> list[str]:
    """The bytes the forward moves, its intensity and, on a prediction device, the roofline's time
    beside the measured one."""
    if not summary.bytes:
        return []
    lines = [
        _line("fwd bytes read and written per GPU", deepspeed_bytes(summary.bytes)),
        _line("fwd arithmetic intensity = fwd flops / fwd bytes", f"{summary.intensity:.3g} flops/byte"),
    ]
    spec = summary.prediction_device
    if spec is not None and summary.predicted_s is not None:
        lines.append(_line(f"predicted fwd latency on {spec.name} ({summary.bound}-bound; ridge {summary.ridge:.3g} flops/byte)", _seconds(summary.predicted_s)))
        lines.append(_line("  its error", error_note(spec, summary.prediction_figure)))
        if summary.predicted_to_measured is not None:
            lines.append(_line("predicted / measured fwd latency (without the timing hooks)", f"{summary.predicted_to_measured:.3g}"))
        elif summary.measured_on is not None:
            lines.append(_line("predicted / measured fwd latency", f"not compared: predicted on {spec.name}, measured on {summary.measured_on}"))
    return lines


def _memory_lines(memory: Optional[MemoryEstimate], summary: ProfileSummary) -> list[str]:
    """The estimated peak (:func:`jitflops.estimates.memory_footprint`), what was alive at it and, on a
    prediction device with a memory size, whether it fits."""
    if memory is None:
        return []
    what = f"training step, {memory.optimizer}" if memory.mode == "training" else "inference"
    lines = [_line(f"memory peak per GPU (estimated: {what}; in the {memory.peak_phase})", deepspeed_bytes(memory.peak))]
    lines += [_line(f"memory at peak: {name.replace('_', ' ')}", deepspeed_bytes(memory.at_peak[name])) for name in CATEGORIES if memory.at_peak.get(name)]
    if memory.kv_cache is not None:
        lines.append(_line(f"KV cache at {memory.kv_cache.length} tokens (memory needed with it)", f"{deepspeed_bytes(memory.kv_cache.bytes)} ({deepspeed_bytes(memory.needed())})"))
    spec = summary.prediction_device
    if spec is not None and spec.memory_bytes:
        verdict = "fits" if memory.fits(spec) else "does NOT fit"
        lines.append(_line(f"memory on {spec.name} ({deepspeed_bytes(spec.memory_bytes)})", f"{verdict}: {100 * memory.needed() / spec.memory_bytes:.0f}%"))
    return lines


def _summary_lines(summary: ProfileSummary, step: Optional[int], convention: str) -> list[str]:
    mp = summary.parallel.model_parallel
    forward = summary.forward.median if summary.forward else None
    lines = [
        _line("world size", summary.parallel.world),
        _line("data parallel size", summary.parallel.data_parallel),
        _line("model parallel size", mp),
        _line("batch size per GPU", summary.batch_size if summary.batch_size is not None else "N/A"),
        _line("params per GPU", deepspeed_params(summary.params)),
        _line("params of model = params per GPU * mp_size", deepspeed_params(summary.params * mp)),
        _line("fwd MACs per GPU", deepspeed_macs(summary.macs)),
        *([_line("fwd integer MACs per GPU (IOPs, apart from MACs)", deepspeed_macs(summary.int_macs))] if summary.int_macs else []),
        *([_line("fwd attention MACs per GPU its masks discard (in fwd MACs: dense)", deepspeed_macs(summary.masked_out_macs))] if summary.masked_out_macs else []),
        _line("fwd flops per GPU", deepspeed_number(summary.flops)),
        _line("fwd flops of model = fwd flops per GPU * mp_size", deepspeed_number(summary.flops * mp)),
        _line("fwd latency", _seconds(forward)),
        _line("fwd FLOPS per GPU = fwd flops per GPU / fwd latency", _rate(summary.forward_flops_per_second)),
    ]
    if summary.backward is not None:
        factor = summary.backward_factor
        lines += [
            _line("bwd latency", _seconds(summary.backward.median)),
            _line(f"bwd FLOPS per GPU = {factor:.3g} * fwd flops per GPU / bwd latency", _rate(summary.backward_flops_per_second)),
            _line(f"fwd+bwd FLOPS per GPU = {factor + 1:.3g} * fwd flops per GPU / (fwd+bwd latency)", _rate(summary.forward_backward_flops_per_second)),
        ]
    if summary.step is not None:
        lines.append(_line("step latency", _seconds(summary.step.median)))
    if summary.backward is not None:
        lines += [
            _line("iter latency", _seconds(summary.iteration_latency)),
            _line(f"FLOPS per GPU = {summary.backward_factor + 1:.3g} * fwd flops per GPU / iter latency", _rate(summary.iteration_flops_per_second)),
            _line("samples/second", "N/A" if summary.samples_per_second is None else round(summary.samples_per_second, 2)),
        ]
    if summary.backward_macs is not None:
        lines.append(_line("bwd MACs per GPU (measured by jitflops)", f"{deepspeed_macs(summary.backward_macs)} = {summary.backward_factor:.3g} x fwd"))
        if summary.recompute_macs:
            lines.append(_line("recompute MACs per GPU (activation checkpointing, attention kernels' scores; apart from bwd)", deepspeed_macs(summary.recompute_macs)))
    lines.append(_line("forward passes profiled", summary.forwards))
    lines.append(_line("counted by", summary.front_end))
    if summary.model_class:
        lines.append(_line("model class", summary.model_class))
    lines += _roofline_lines(summary)
    lines += _communication_lines(summary)
    if summary.forward is not None and len(summary.forward.samples) > 1:
        lines.append(_line("fwd latency runs", f"median of {len(summary.forward.samples)} runs, IQR {deepspeed_seconds(summary.forward.iqr)}"))
        if summary.forward.noisy:
            lines.append("warning: the fwd latency's spread (IQR) is larger than its median: the machine is busy; timings are unreliable")
    if summary.mfu is not None:
        model = "model FLOPS (masked-out attention left out)" if summary.masked_out_macs else "FLOPS"
        lines.append(_line(f"MFU = {model} per GPU / peak FLOPS per GPU", f"{100 * summary.mfu:.2f}% of {deepspeed_flops(summary.peak_flops or 0)}"))
        if summary.recompute_flops or summary.masked_out_macs:
            lines.append(_line("HFU = (flops + recomputed flops) / latency / peak FLOPS per GPU", f"{100 * summary.hfu:.2f}%"))
    if summary.timing_overhead is not None:
        tiny = summary.forward is not None and summary.forward.median < TINY_FORWARD_S
        overhead = f"n/a (the forward takes under {TINY_FORWARD_S * 1e3:g} ms: the hooks' own cost dominates)" if tiny else f"{100 * summary.timing_overhead:.1f}%"
        lines.append(_line("timing overhead (fwd with hooks / without - 1)", overhead))
    lines += _page_fault_lines(summary) + _other_load_lines(summary)
    header = f"Profile Summary at step {step}:" if step is not None else "Profile Summary:"
    return [
        "",
        SUMMARY_TITLE,
        header,
        "Notations:",
        "data parallel size (dp_size), model parallel size(mp_size),",
        "number of parameters (params), number of multiply-accumulate operations(MACs),",
        "number of floating-point operations (flops), floating-point operations per second (FLOPS),",
        "fwd latency (forward propagation latency), bwd latency (backward propagation latency),",
        "step (weights update latency), iter latency (sum of fwd, bwd and step latency)",
        f"Counted by jitflops: {convention}.",
        f"Latency on {summary.device}: " + ("the median of the timed runs." if summary.forwards == 1 else f"the total of the {summary.forwards} forwards profiled, as the counts are."),
        "",
    ] + lines


def _page_fault_lines(summary: ProfileSummary) -> list[str]:
    """The fresh pages each forward faulted in, and what they mean where they are many."""
    if summary.page_faults is None:
        return []
    faulted = summary.page_faults * mmap.PAGESIZE
    lines = [_line("minor page faults per fwd (fresh pages, without hooks)", f"{summary.page_faults:,} ({deepspeed_bytes(faulted)} at {mmap.PAGESIZE // 1024} KiB a page)")]
    if faulted >= FAULTS_WORTH_A_NOTE:
        lines.append("note: each fwd faults in memory its allocator gave back to the OS (glibc trims its heap and unmaps large blocks; "
                     "MALLOC_TRIM_THRESHOLD_ and MALLOC_MMAP_THRESHOLD_, or jemalloc, keep it); the predicted time leaves that out")
    return lines


def _other_load_lines(summary: ProfileSummary) -> list[str]:
    """The cores other processes kept busy while the forward was timed, and what they do to it where they are many."""
    if summary.other_cores is None:
        return []
    lines = [_line("other processes' CPU while timed (cores busy)", f"{summary.other_cores:.2f}")]
    if summary.other_cores >= OTHER_CORES_WORTH_A_NOTE:
        ranks = " (this machine's other ranks among them)" if summary.parallel.world > 1 else ""
        lines.append(f"note: other processes{ranks} kept {summary.other_cores:.2f} cores busy while this was timed: where they share its cores, "
                     "its latencies are slower than this machine gives alone (on a 2-core VM, a process using 1.4 cores made a decode step 4 to 10 times slower)")
    return lines


def format_aggregated_profile(root: ModuleProfile, module_depth: int = -1, top_modules: int = 1) -> str:
    """Top modules by params, MACs and latency at each depth, grouped by module type."""
    by_depth: dict[int, list[ModuleProfile]] = defaultdict(list)
    for node in root.walk():
        by_depth[node.depth].append(node)
    deepest = max(by_depth)
    last = deepest if module_depth < 0 else min(module_depth, deepest)
    lines = [f"Top {top_modules} modules in terms of params, MACs or fwd latency at different model depths:"]
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
            return str({name: render(value) for name, value in ranked})

        lines += [
            f"depth {depth}:",
            f"    params      - {top(params, deepspeed_params)}",
            f"    MACs        - {top(macs, deepspeed_macs)}",
            f"    fwd latency - {top(latency, deepspeed_seconds)}",
        ]
    return "\n".join(lines)


def _percent(part: float, whole: float) -> str:
    return f"{round(100 * part / whole, 2) if whole else 0:g}%"


def _detailed_lines(root: ModuleProfile, peak_flops: Optional[float], ranks: int, ridge: Optional[float], memory: Optional[MemoryEstimate]) -> list[str]:
    total_latency = root.latency.median if root.latency else 0.0

    def describe(node: ModuleProfile) -> str:
        latency = node.latency.median if node.latency else 0.0
        rate = node.flops_per_second
        items = [
            f"{deepspeed_params(node.params)} = {_percent(node.params, root.params)} Params",
            f"{deepspeed_macs(node.macs)} = {_percent(node.macs, root.macs)} MACs",
            f"{deepspeed_seconds(latency)} = {_percent(latency, total_latency)} latency",
            deepspeed_flops(rate or 0),
        ]
        mfu = node.mfu(peak_flops)
        if mfu is not None:
            items.append(f"{100 * mfu:.2f}% MFU")
        if node.comm_bytes:
            items.append(f"{deepspeed_bytes(node.comm_bytes)} comm")
        if node.predicted_s is not None:  # the roofline's, on the profile's prediction device
            measured = f" = {node.predicted_to_measured:.2f} x measured" if node.predicted_to_measured is not None else ""
            bound = f" ({node.bound(ridge)}-bound)" if node.bound(ridge) else ""
            items.append(f"{deepspeed_seconds(node.predicted_s)} predicted{measured}, {node.intensity or 0:.3g} flops/byte{bound}")
        if memory is not None and node.name in memory.modules:
            items.append(f"{deepspeed_bytes(memory.modules[node.name].total)} memory")
        if node.extra_repr:
            items.append(node.extra_repr)
        return ", ".join(items)

    return [
        "",
        DETAILED_TITLE,
        "Each module profile is listed after its name in the following order: ",
        "params, percentage of total params, MACs, percentage of total MACs, fwd latency, percentage of total fwd latency, fwd FLOPS"
        + (", MFU" if peak_flops else "")
        + (", memory (estimated: parameters, buffers, gradients, optimizer state and saved activations, submodules included)" if memory is not None else ""),
        "",
        "Note: 1. A module can have torch.nn.module or torch.nn.functional to compute logits (e.g. CrossEntropyLoss). "
        "They are not counted as submodules, thus not to be printed out. However they make up the difference between "
        "a parent's MACs (or latency) and the sum of its submodules'.",
        "2. Number of floating-point operations is a theoretical estimation, thus FLOPS computed using that could be "
        "larger than the maximum system throughput.",
        *([f"3. Gathered over {ranks} ranks: params are this rank's, MACs and comm the sum over ranks, latency the median over ranks, MFU against the sum of their peaks."] if ranks else []),
        "",
        _render(root, describe),
    ]


def _render(node: ModuleProfile, describe: Callable[[ModuleProfile], str]) -> str:
    """``nn.Module.__repr__``'s layout, with ``describe``'s figures as each module's extra_repr."""
    children = node.children
    if not children:
        return f"{node.type_name}({describe(node)})"
    lines = [describe(node)] + [f"({child.name.rpartition('.')[2]}): " + _render(child, describe).replace("\n", "\n  ") for child in children]
    return f"{node.type_name}(\n  " + "\n  ".join(lines) + "\n)"


def format_model_profile(
    profile: ModelProfile,
    module_depth: int = -1,
    top_modules: int = 1,
    detailed: bool = True,
    memory: Optional[MemoryEstimate] = None,
) -> str:
    """The profile as DeepSpeed prints it; ``module_depth`` (-1: all) and ``top_modules`` choose
    the aggregated profile's depths and modules, as there; the detailed tree is the whole model.
    With ``memory`` (:func:`jitflops.estimates.memory_footprint` of the same model), the summary gives its
    peak and the tree each module's memory."""
    lines = _summary_lines(profile.summary, profile.step, profile.convention) + _memory_lines(memory, profile.summary) + _generation_lines(profile) + _cluster_lines(profile)
    lines += ["", AGGREGATED_TITLE, format_aggregated_profile(profile.root, module_depth, top_modules)]
    if detailed:
        lines += _detailed_lines(profile.root, profile.tree_peak_flops, len(profile.ranks), profile.summary.ridge, memory)
    lines.append(_END)
    return "\n".join(lines)
