"""A memory estimate as text: the peak, what was alive at it, whether it fits, and a per-module table.

Memory is given in binary units (GiB, as device memory is sold and ``nvidia-smi`` shows it).
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

from ..core.table import pipe_table
from ..estimates.devices import DeviceSpec
from ..estimates.memory_estimate import CATEGORIES, MemoryEstimate
from ..estimates.memory_levers import LeverEstimate

_COLUMNS = ("parameters", "buffers", "gradients", "optimizer_state", "saved_activations", "temporaries")


def format_bytes(nbytes: float) -> str:
    """``1536 -> '1.50 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.2f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def memory_summary(estimate: MemoryEstimate, memory: Union[None, int, str, DeviceSpec] = None) -> str:
    """The peak and its breakdown; with ``memory`` (bytes or a device), whether it fits."""
    settings = ", ".join(f"{key} {value}" for key, value in estimate.settings.items() if value not in (None, False))
    what = f"training step ({estimate.optimizer})" if estimate.mode == "training" else "inference"
    lines = [f"Memory of a {what}{': ' + settings if settings else ''}",
             f"  peak: {format_bytes(estimate.peak)} ({estimate.peak:,} B), in the {estimate.peak_phase}"]
    lines += [f"    {name.replace('_', ' ')}: {format_bytes(estimate.at_peak[name])}" for name in CATEGORIES if estimate.at_peak.get(name)]
    if estimate.kv_cache is not None:
        cache = estimate.kv_cache
        lines.append(f"  KV cache: {format_bytes(cache.bytes_per_token)} per token; {cache.batch} x {cache.length} tokens: {format_bytes(cache.bytes)}"
                     f" (needed with it: {format_bytes(estimate.needed())})")
    if estimate.unseen_saved_modules:
        lines.append("  kept after the forward but unseen by saved-tensor hooks (checkpoint inputs, a custom Function's ctx, module state): "
                     + ", ".join(name or "the model" for name in estimate.unseen_saved_modules))
    if memory is not None:
        capacity = estimate.capacity_of(memory)
        verdict = "fits" if estimate.fits(memory) else "does NOT fit"
        where = memory.name if isinstance(memory, DeviceSpec) else memory if isinstance(memory, str) else "the memory given"
        over = f", {format_bytes(estimate.needed() - capacity)} over" if not estimate.fits(memory) else ""
        lines.append(f"  {verdict} in {where} ({format_bytes(capacity)}): "
                     f"{estimate.needed() / capacity:.0%} of it{over}")
    return "\n".join(lines)


def memory_table(estimate: MemoryEstimate, max_depth: Optional[int] = 3) -> str:
    """One row per module down to ``max_depth``: bytes per category, submodules included. Each
    module by its full name, indented by its depth, as ``flop_count_table`` shows them."""
    rows = []
    for module in estimate.modules.values():
        depth = module.name.count(".") + 1 if module.name else 0
        if max_depth is not None and depth > max_depth:
            continue
        label = " " * depth + module.name if module.name else "(model)"
        rows.append([label] + [format_bytes(getattr(module, column)) if getattr(module, column) else "" for column in _COLUMNS])
    headers = ["module"] + [column.replace("_", " ") for column in _COLUMNS]
    return pipe_table(rows, headers, colalign=("left",) + ("right",) * len(_COLUMNS))


def lever_table(levers: Sequence[LeverEstimate], where: str) -> str:
    """What each lever needs, and whether it fits in ``where`` (a device's name)."""
    rows = [[lever.lever, format_bytes(lever.estimate.needed()) if lever.estimate else "", "yes" if lever.fits else "no", lever.reason] for lever in levers]
    return pipe_table(rows, ["change", "peak", f"fits in {where}", "why not"], colalign=("left", "right", "left", "left"))
