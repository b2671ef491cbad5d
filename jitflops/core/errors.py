"""Errors jitflops raises. Each names the module path and, where there is one, the op at fault."""

from __future__ import annotations


class JitflopsError(RuntimeError):
    """Base class of every error jitflops raises on bad models, inputs or handles."""


def describe_scope(scope: str) -> str:
    return f"module '{scope}'" if scope else "the root module"


class OpShapeError(JitflopsError):
    """An op's recorded arguments do not have the shape a formula needs."""

    def __init__(self, kind: str, scope: str, problem: str) -> None:
        super().__init__(f"op {kind} in {describe_scope(scope)}: {problem}")
        self.kind = kind
        self.scope = scope


class TraceError(JitflopsError):
    """The model could not be run under a front end or a timer; names the innermost module that was
    running. ``activity`` says what was being done: tracing, recording, timing, profiling."""

    def __init__(self, scope: str, module_type: str, cause: BaseException, activity: str = "tracing") -> None:
        where = f"{describe_scope(scope)} ({module_type})"
        super().__init__(f"{activity} failed in {where}: {type(cause).__name__}: {cause}")
        self.scope = scope
        self.module_type = module_type


class HandleError(JitflopsError):
    """A handle raised, or returned something that is not a count."""

    def __init__(self, kind: str, scope: str, problem: str) -> None:
        super().__init__(f"handle for op {kind} in {describe_scope(scope)} {problem}")
        self.kind = kind
        self.scope = scope


class DataDependentTraceWarning(UserWarning):
    """The model's Python depends on tensor values (a branch, a size): the JIT trace, or
    ``torch.export.draft_export`` where ``torch.export`` cannot export it, took these inputs'
    values, and the count holds for them."""


class IntegerWorkWarning(UserWarning):
    """A FLOP count left out integer multiply-accumulates (quantized products): the message says how
    many, in which modules, and that :class:`~jitflops.IntegerOpCountAnalysis` counts them."""


class JitFallbackWarning(UserWarning):
    """The JIT tracer cannot trace the model: the dispatch backend counted it instead (the message says why)."""
