"""Elementwise kernels by kind, on the spec's curves by the elements they write: transcendental
functions by group (the vector unit's: ``exp``-like, ``tanh``-like, ``erf``, ``log``, ``sqrt``), a copy (a
cast, a concatenation, a clone, a padding, a fill), random numbers drawn (dropout's mask), a
membership test (``isin``: a loop an element), an op in place (no output to allocate), and every other pointwise op (arithmetic, comparisons, selections, ReLU-like activations). The curves
are timed on operands in the caches; where a spec reads them from memory (an optimizer's step),
an op takes at least its traffic at the memory's bandwidth. What moves nothing
(a cast to the dtype a tensor has, dropout in eval) takes no kernel: the traffic formulas give it
no bytes."""

from __future__ import annotations

from typing import Optional

from ...core.records import OpRecord
from ...handles.elementwise import POINTWISE_OPS
from ...handles.registry import with_inplace
from ..devices import DeviceSpec
from ..measured_curves import curve_seconds
from .operands import output_elements
from .registry import KERNEL_COSTS, curve_of, memory_seconds

TRANSCENDENTAL: dict[str, str] = {
    **dict.fromkeys(with_inplace(
        "exp exp2 expm1 sigmoid silu softplus elu selu celu mish log_sigmoid sin cos tan asin acos atan atan2 sinh cosh gelu "
        "gelu_backward silu_backward sigmoid_backward mish_backward elu_backward softplus_backward"), "exp"),
    **dict.fromkeys(with_inplace("tanh tanh_backward"), "tanh"),
    **dict.fromkeys(with_inplace("erf erfc erfinv"), "erf"),
    **dict.fromkeys(with_inplace("log log2 log10 log1p logit xlogy"), "log"),
    **dict.fromkeys(with_inplace("sqrt"), "sqrt"),
}
"""Pointwise ops a vector unit computes in many instructions an element, by the calibrated
function of their group (:mod:`jitflops.timing.calibration.elementwise`)."""

COPIES = frozenset(with_inplace(
    "to _to_copy copy clone contiguous cat concat concatenate stack repeat repeat_interleave flip roll pad constant_pad_nd "
    "reflection_pad1d reflection_pad2d replication_pad1d replication_pad2d fill zero zeros zeros_like ones ones_like full full_like "
    "new_zeros new_ones new_full arange tril triu type_as expand_copy index_copy masked_scatter"
))
"""Ops that copy or fill without arithmetic."""


RANDOM = frozenset(with_inplace("bernoulli normal uniform random exponential cauchy geometric log_normal rand rand_like randn randn_like"))
"""Ops that draw random numbers: a CPU's generator takes several times an arithmetic op's time an
element (training's dropout draws its mask with ``bernoulli_``: 40 ms for 3 M elements on a 2-core
AVX2 CPU, where an ``add`` takes 2)."""


SERIAL = frozenset(with_inplace("isin"))
"""Ops a CPU runs an element at a time (``isin``'s loop over the values it tests against), not by
the vector unit: their own curve (``serial``)."""


def _pow_family(op: OpRecord) -> str:
    """``pow`` by a small whole exponent is multiplications; by any other, the vector unit's ``exp``
    and ``log`` (as slow as a ``sqrt``)."""
    exponent = op.arg_or("exponent", None)
    return "arithmetic" if isinstance(exponent, (int, float)) and float(exponent).is_integer() and 0 <= exponent <= 4 else "sqrt"


def elementwise_family(op: OpRecord) -> str:
    """The calibrated curve an elementwise op is read from."""
    if op.kind in ("aten::pow", "aten::pow_", "aten::float_power"):
        return _pow_family(op)
    if op.kind == "aten::gelu" and op.arg_or("approximate", "none") == "tanh":
        return "tanh"
    if op.kind in TRANSCENDENTAL:
        return TRANSCENDENTAL[op.kind]
    if op.kind in COPIES:
        return "copy"
    if op.kind in RANDOM:
        return "random"
    if op.kind in SERIAL:
        return "serial"
    return "inplace" if op.kind.endswith("_") else "arithmetic"


ELEMENTWISE_KINDS = frozenset((set(POINTWISE_OPS) | COPIES | RANDOM) - {"aten::diff"})


@KERNEL_COSTS.register(*sorted(ELEMENTWISE_KINDS))
def elementwise_seconds(op: OpRecord, spec: DeviceSpec, flops: float, traffic: float) -> Optional[float]:
    if not traffic:
        return 0.0
    curve = curve_of(spec, elementwise_family(op))
    if curve is None:
        return None
    seconds = curve_seconds(curve, output_elements(op))
    if spec.operands_from_memory:
        seconds = max(seconds, spec.operands_from_memory * memory_seconds(traffic, spec))
    return seconds
