"""Integer work: the multiply-accumulates of quantized layers and integer products (IOPs).

A FLOP count gives quantized products zero FLOPs, as they do no floating-point arithmetic, and
never calls them unsupported. :class:`IntegerOpCountAnalysis` counts their integer
multiply-accumulates instead (:mod:`jitflops.handles.integer`), from the same recording: a model
with both (a dynamically quantized Linear beside a float attention) has its float MACs in
``FlopCountAnalysis`` and its integer MACs here, never mixed.
"""

from __future__ import annotations

from typing import Mapping

from ..handles import FLOP_FORMULAS, INTEGER_MAC_FORMULAS, Handle
from .jit_analysis import JitModelAnalysis

_DEFAULT_SUPPORTED_OPS: dict[str, Handle] = INTEGER_MAC_FORMULAS.handles()


class IntegerOpCountAnalysis(JitModelAnalysis):
    """Integer multiply-accumulates (IOPs) per module and per operator: quantized Linear and
    convolution layers (dynamic and static), ``_int_mm``, and the int8/int4 weight-only products.
    Every float op counts zero.

    Quantized modules hold packed weights the JIT tracer cannot take: the default call counts them
    with the dispatch backend (with a ``JitFallbackWarning``), as ``FlopCountAnalysis`` does.

    >>> iops = IntegerOpCountAnalysis(quantized_model, inputs)
    >>> iops.total(), iops.by_operator(), iops.by_module()
    """

    @classmethod
    def _default_handles(cls) -> Mapping[str, Handle]:
        return _DEFAULT_SUPPORTED_OPS

    @classmethod
    def _default_ignored_ops(cls) -> frozenset[str]:
        return super()._default_ignored_ops() - INTEGER_MAC_FORMULAS.kinds() | FLOP_FORMULAS.kinds()
