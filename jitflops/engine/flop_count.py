"""FLOP counting: fvcore's ``FlopCountAnalysis`` and ``flop_count``, with complete op coverage."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Mapping
from typing import Any, DefaultDict, Optional, Union

from torch import nn

from .jit_analysis import JitModelAnalysis, per_operator_in_units
from .counting import Statistics
from ..frontends.dispatch_trace import BackwardFn, record_with_dispatch
from ..core.errors import IntegerWorkWarning
from ..frontends.program_source import ProgramSource
from ..handles import ELEMENTWISE_FLOP_FORMULAS, FLOP_FORMULAS, INTEGER_MAC_FORMULAS, MASKED_ATTENTION_FORMULAS, Handle
from .integer_count import IntegerOpCountAnalysis
from ..frontends.jit_mask_readings import MaskReadingTrace
from ..frontends.meta_values import holds_meta
from ..core.op_source import OpSource
from ..frontends.scoped_trace import ScopedTrace


ATTENTION_CONVENTIONS = ("dense", "masked")

_DEFAULT_SUPPORTED_OPS: dict[str, Handle] = FLOP_FORMULAS.handles()
"""The handles every new ``FlopCountAnalysis`` starts from, as in fvcore: changing this table changes
what later analyses count."""


class FlopCountAnalysis(JitModelAnalysis):
    """FLOPs per module and per operator, by JIT trace.

    The convention is fvcore's, so published numbers reproduce: one fused multiply-add counts as
    one flop, and bias additions are not counted. Elementwise arithmetic, activation functions,
    reductions and softmax are known ops that count zero unless ``elementwise=True``; then they
    count one flop per output element (reductions: per input element; softmax: three).

    >>> flops = FlopCountAnalysis(model, inputs)
    >>> flops.total(), flops.by_operator(), flops.by_module(), flops.total("layer1.0")
    """

    def __init__(
        self,
        model: Union[nn.Module, ProgramSource],
        inputs: Any = None,
        kwargs: Optional[Mapping[str, Any]] = None,
        *,
        elementwise: bool = False,
        attention: str = "dense",
        backend: str = "jit",
        backward: Union[bool, BackwardFn] = False,
        strict: bool = False,
        compute: Optional[bool] = None,
    ) -> None:
        """See :class:`JitModelAnalysis` for ``backend``, ``backward``, ``strict`` and ``compute``;
        ``elementwise=True`` also counts elementwise ops. ``attention``: ``"dense"`` (default) counts
        every (query, key) pair, as kernels are charged and papers report; ``"masked"`` only those
        the attention mask keeps (causal, sliding-window, chunked, padding masks: see
        :mod:`jitflops.handles.attention`)."""
        if attention not in ATTENTION_CONVENTIONS:
            raise ValueError(f"attention must be one of {ATTENTION_CONVENTIONS}, got {attention!r}")
        super().__init__(model, inputs, kwargs, backend=backend, backward=backward, strict=strict, compute=compute)
        self._elementwise = elementwise
        self._attention = attention
        if elementwise:
            self.set_op_handle(**ELEMENTWISE_FLOP_FORMULAS.handles())
        if attention == "masked":
            self.set_op_handle(**MASKED_ATTENTION_FORMULAS.handles())

    @classmethod
    def _default_handles(cls) -> dict[str, Handle]:
        return _DEFAULT_SUPPORTED_OPS

    def _analyze(self, trace: OpSource) -> Statistics:
        """Under the mask-aware convention a JIT trace's masks are read by one eager run of the call
        (:mod:`jitflops.frontends.jit_mask_readings`), unless counting may not compute (``compute=False``)
        or there are no values to read (the meta device)."""
        if (
            self._attention == "masked" and isinstance(trace, ScopedTrace)
            and self._compute is not False and not holds_meta(list(self._model.parameters()), self._call)  # values to read
        ):
            trace = MaskReadingTrace(trace, lambda: record_with_dispatch(self._model, self._call, self._aliases))
        return super()._analyze(trace)

    def _counts_calls(self) -> bool:
        """A FLOP count under dense attention may count from the model's calls (a masked count reads
        its masks into a JIT trace)."""
        return self._attention != "masked"

    def _new_like(self, model: nn.Module, inputs: Any, kwargs: Optional[Mapping[str, Any]]) -> "FlopCountAnalysis":
        return type(self)(model, inputs, kwargs, elementwise=self._elementwise, attention=self._attention, **self._front_end_settings())

    def masked_attention(self) -> "FlopCountAnalysis":
        """This count (its handles, from its recording) with attention counted by the pairs its masks
        keep: the ``attention="masked"`` convention beside this one."""
        masked = self.of_same_recording(FlopCountAnalysis, elementwise=self._elementwise, attention="masked")
        masked._op_handles, masked._ignored_ops = dict(self._op_handles), set(self._ignored_ops)
        return masked.set_op_handle(**MASKED_ATTENTION_FORMULAS.handles())

    def integer_macs(self) -> Counter[str]:
        """The integer multiply-accumulates this FLOP count leaves out (quantized and integer
        products are no floating-point work), per module that ran them: what
        :class:`~jitflops.IntegerOpCountAnalysis` counts from the same recording. Empty where the
        model ran none, or where a handle set here counts them."""
        trace = self._recording()
        left_out = {kind for kind in INTEGER_MAC_FORMULAS.kinds() if kind in self._ignored_ops and kind not in self._op_handles}
        if not any(kind in left_out for kind, _ in trace.operations()):
            return Counter()
        integer = self.of_same_recording(IntegerOpCountAnalysis)
        per_module: Counter[str] = Counter()
        for op in integer.op_counts():
            if op.kind in left_out and op.count:
                per_module[op.module] += int(op.count)
        return per_module

    def _warn_left_out(self) -> None:
        """A FLOP count of 0 for a quantized model is right (no float work) but silent: say where the
        integer work went, as a warning users can filter (:class:`~jitflops.core.errors.IntegerWorkWarning`)."""
        left_out = self.integer_macs()
        if left_out:
            where = ", ".join(f"{module or 'the model'!r}: {count:,}" for module, count in left_out.most_common(5))
            more = f" and {len(left_out) - 5} more modules" if len(left_out) > 5 else ""
            warnings.warn(
                f"jitflops: {sum(left_out.values()):,} integer MACs of quantized or integer products are not FLOPs and are "
                f"left out of this count ({where}{more}): IntegerOpCountAnalysis counts them",
                IntegerWorkWarning,
                stacklevel=4,
            )

    @property
    def counts_elementwise(self) -> bool:
        return self._elementwise

    def convention(self) -> str:
        """One line that says what was counted, for printouts and exports."""
        elementwise = (
            "elementwise ops (arithmetic, activation functions, softmax) counted (1 flop per element)"
            if self._elementwise
            else "elementwise ops (arithmetic, activation functions, softmax) not counted (elementwise=True counts them)"
        )
        counted = f"; counted by the dispatch backend: {self.fallback_reason}" if self.fallback_reason else ""
        attention = "attention: the pairs its mask keeps" if self._attention == "masked" else "attention dense (masks not followed)"
        integer = sum(self.integer_macs().values())
        left_out = f"; integer products are not flops: {integer:,} integer MACs left to IntegerOpCountAnalysis" if integer else ""
        return f"1 fused multiply-add = 1 flop (fvcore's convention: #flops here are MACs; JSON, CSV, op table and DeepSpeed outputs give flops = 2 x MACs); bias adds not counted; {elementwise}; {attention}{left_out}{counted}"


def flop_count(
    model: nn.Module,
    inputs: Any,
    supported_ops: Optional[dict[str, Handle]] = None,
) -> tuple[DefaultDict[str, float], Counter[str]]:
    """GFLOPs per operator and the unsupported ops, as ``fvcore.nn.flop_count`` returns them."""
    analysis = FlopCountAnalysis(model, inputs).set_op_handle(**(supported_ops or {}))
    return per_operator_in_units(analysis, 1e9)
