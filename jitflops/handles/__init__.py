"""Per-op handles, one module per op family, and the tables that collect them.

Importing this package registers every formula. ``default_flop_handles()`` and
``default_activation_handles()`` are what the analyses start from; ``known_op_kinds()`` is every op
jitflops has a convention for, counted or not.
"""

from __future__ import annotations

from . import (  # noqa: F401  importing each op family registers its formulas
    activations,
    attention,
    collectives,
    convolution,
    decompositions,
    distances,
    einsum,
    elementwise,
    fused_layers,
    integer,
    linear_algebra,
    normalization,
    recurrent,
    resampling,
    spectral,
)
from .registry import (
    ACTIVATION_FORMULAS,
    ELEMENTWISE_FLOP_FORMULAS,
    FLOP_FORMULAS,
    Count,
    FormulaTable,
    FvcoreHandle,
    Handle,
    ShapeFormula,
    short_op_name,
)
from .attention import MASKED_ATTENTION_FORMULAS
from .collectives import COMMUNICATION_FORMULAS, Collective, collective_of
from .integer import INTEGER_MAC_FORMULAS
from .shapes import get_shape
from .zero_cost import ZERO_COST_OPS


def known_op_kinds() -> frozenset[str]:
    """Every op kind with a formula or on the zero-cost list, collectives included."""
    return FLOP_FORMULAS.kinds() | ELEMENTWISE_FLOP_FORMULAS.kinds() | ZERO_COST_OPS | COMMUNICATION_FORMULAS.kinds() | INTEGER_MAC_FORMULAS.kinds()


__all__ = [
    "ACTIVATION_FORMULAS",
    "COMMUNICATION_FORMULAS",
    "Collective",
    "ELEMENTWISE_FLOP_FORMULAS",
    "FLOP_FORMULAS",
    "ZERO_COST_OPS",
    "collective_of",
    "Count",
    "FormulaTable",
    "FvcoreHandle",
    "INTEGER_MAC_FORMULAS",
    "MASKED_ATTENTION_FORMULAS",
    "Handle",
    "ShapeFormula",
    "get_shape",
    "known_op_kinds",
    "short_op_name",
]
