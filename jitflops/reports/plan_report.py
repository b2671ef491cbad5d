"""A training plan as text: the layout, memory per GPU, the step's time split into its parts,
throughput, MFU and the token budget's GPU-hours; a search's layouts as a table, best first; serving
plans side by side. Each printout ends with its measured error."""

from __future__ import annotations

from typing import Sequence

from ..core.table import pipe_table
from ..planning.plan import TrainingPlan
from ..planning.serving import ServingPlan
from .formatting import format_quantity, format_seconds
from .memory_report import format_bytes


def _fits(plan: TrainingPlan) -> str:
    if plan.memory_bytes is None:
        return "unknown (the device has no memory size)"
    return "fits" if plan.fits else f"does not fit: {format_bytes(plan.memory_per_gpu_bytes - plan.memory_bytes)} over"


def _memory_parts(plan: TrainingPlan) -> str:
    """The largest stage's memory by what holds it."""
    stage = max(plan.memory_per_stage, key=lambda each: each.total)
    parts = (("weights", stage.weights), ("kept gradients", stage.kept_gradients), ("optimizer state", stage.optimizer_state),
             ("pipeline receive buffers", stage.receive_buffers),
             ("activations and transients at the peak", stage.step_peak))
    return " + ".join(f"{name} {format_bytes(value)}" for name, value in parts if value or name == "weights")


def plan_text(plan: TrainingPlan, model_name: str = "the model") -> str:
    """One plan, part by part."""
    b = plan.breakdown
    parts = (("compute", b.compute_s), ("tensor-parallel exposed", b.tensor_parallel_s), ("context-parallel exposed", b.context_parallel_s),
             ("expert all-to-alls", b.expert_parallel_s), ("pipeline sends", b.pipeline_send_s), ("bubble", b.bubble_s),
             ("data-parallel exposed", b.data_parallel_s), ("optimizer", b.optimizer_s))
    capacity = f" of {format_bytes(plan.memory_bytes)}" if plan.memory_bytes is not None else ""
    lines = [
        f"Training plan: {model_name} on {plan.gpus} x {plan.device} ({plan.interconnect}), sequences of {plan.sequence} tokens, {plan.global_batch} a step",
        f"  layout: {plan.layout.describe()}",
        f"  memory per GPU: {format_bytes(plan.memory_per_gpu_bytes)}{capacity} ({_fits(plan)}) = " + _memory_parts(plan)
        + (f"; per stage: {', '.join(map(format_bytes, plan.memory_per_stage_bytes))}" if len(plan.memory_per_stage_bytes) > 1 else ""),
        f"  step: {format_seconds(plan.step_s)} = " + " + ".join(f"{part} {format_seconds(seconds)}" for part, seconds in parts if seconds or part == "compute"),
        f"  throughput: {format_quantity(plan.tokens_per_s, 'tokens/s')}, {plan.model_tflops_per_gpu:.1f} model TFLOP/s per GPU, "
        f"MFU {plan.mfu:.1%} (HFU {plan.hfu:.1%})",
    ]
    if plan.collectives:
        lines.append("  collectives a step: " + "; ".join(f"{each.group} {each.name} x{each.group_size}: {each.calls} calls, {format_bytes(each.bytes)}"
                                                      for each in plan.collectives))
    if plan.tokens is not None:
        lines.append(f"  {plan.tokens:.3g} tokens: {plan.hours:,.1f} hours, {plan.gpu_hours:,.0f} GPU-hours")
    lines += [f"  note: {note}" for note in plan.notes]
    lines.append(f"  {plan.error}")
    return "\n".join(lines)


def plans_table(plans: Sequence[TrainingPlan]) -> str:
    """Layouts side by side, in the order given (a search's: best first)."""
    rows = [[str(rank), plan.layout.describe(), "yes" if plan.fits else ("no" if plan.fits is False else "?"), format_bytes(plan.memory_per_gpu_bytes),
             format_seconds(plan.step_s), format_quantity(plan.tokens_per_s, "tok/s"), f"{plan.mfu:.1%}"]
            for rank, plan in enumerate(plans, 1)]
    return pipe_table(rows, ("#", "layout", "fits", "memory/GPU", "step", "throughput", "MFU"), colalign=("right", "left", "left", "right", "right", "right", "right"))


def serving_text(plans: Sequence[ServingPlan], model_name: str = "the model") -> str:
    """Serving plans of one call, a row per layout (tensor parallelism, pipeline stages)."""
    first = plans[0]
    rows = [[str(plan.tp), str(plan.pp), format_seconds(plan.prefill_s), format_seconds(plan.decode_s), format_seconds(plan.total_s),
             format_quantity(plan.tokens_per_s, "tok/s"), format_bytes(plan.memory_per_gpu_bytes), format_bytes(plan.kv_cache_per_token_bytes),
             "?" if plan.max_batch is None else f"{plan.max_batch:,}"] for plan in plans]
    table = pipe_table(rows, ("tp", "pp", "prefill", "decode step", "generate", "throughput", "memory/GPU", "KV/token/GPU", "largest batch"),
                       colalign=("right",) * 9)
    return (f"Serving plan: {model_name} on {first.device} ({first.interconnect}), generate() of {first.batch} prompts of {first.prompt} tokens, "
            f"{first.new_tokens} new tokens each\n{table}\n  {first.error}")
