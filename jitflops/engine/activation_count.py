"""Activation counting: fvcore's ``ActivationCountAnalysis`` and ``activation_count``."""

from __future__ import annotations

from typing import Any, Counter, DefaultDict, Optional

from torch import nn

from .jit_analysis import JitModelAnalysis, per_operator_in_units
from ..handles import ACTIVATION_FORMULAS, FLOP_FORMULAS, Handle


_DEFAULT_SUPPORTED_OPS: dict[str, Handle] = ACTIVATION_FORMULAS.handles()
"""The handles every new ``ActivationCountAnalysis`` starts from (mutable, as in fvcore)."""


class ActivationCountAnalysis(JitModelAnalysis):
    """Activations (output elements of convolutions, matrix products, attention and recurrent
    layers) per module and per operator, by JIT trace. Every other known op counts zero."""

    @classmethod
    def _default_handles(cls) -> dict[str, Handle]:
        return _DEFAULT_SUPPORTED_OPS

    @classmethod
    def _default_ignored_ops(cls) -> frozenset[str]:
        return super()._default_ignored_ops() | FLOP_FORMULAS.kinds()


def activation_count(
    model: nn.Module,
    inputs: Any,
    supported_ops: Optional[dict[str, Handle]] = None,
) -> tuple[DefaultDict[str, float], Counter[str]]:
    """Mega-activations per operator and the unsupported ops, as ``fvcore.nn.activation_count`` returns them."""
    analysis = ActivationCountAnalysis(model, inputs).set_op_handle(**(supported_ops or {}))
    return per_operator_in_units(analysis, 1e6)
