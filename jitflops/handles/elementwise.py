"""Elementwise arithmetic, activations, reductions and softmax.

These ops are *known*: they never appear as unsupported. By default they count zero, as in fvcore,
so that published numbers reproduce; ``FlopCountAnalysis(..., elementwise=True)`` counts them with
these formulas:

* pointwise ops (arithmetic, comparisons, activations, selections): 1 flop per output element;
* reductions (sum, mean, var, norm, max, ...): 1 flop per input element;
* softmax and log-softmax: 3 flops per element (exponent, sum, divide).

The backward forms the dispatch front end sees (``gelu_backward``, ``threshold_backward``, ...)
count like their forward ops.
"""

from __future__ import annotations

from ..records import OpRecord
from .registry import ELEMENTWISE_FLOP_FORMULAS
from .shapes import prod


def _with_inplace(names: str) -> list[str]:
    """``"add mul"`` -> the ``aten::`` kinds of those ops and of their in-place forms."""
    return [f"aten::{name}{suffix}" for name in names.split() for suffix in ("", "_")]


POINTWISE_OPS = _with_inplace(
    "add sub rsub mul div true_divide floor_divide remainder fmod neg pow square sqrt rsqrt reciprocal "
    "exp exp2 expm1 log log2 log10 log1p abs sign floor ceil round trunc frac "
    "sin cos tan asin acos atan atan2 sinh cosh tanh erf erfc erfinv sigmoid logit "
    "relu relu6 gelu silu mish hardtanh hardswish hardsigmoid leaky_relu elu selu celu softplus softshrink "
    "hardshrink tanhshrink softsign threshold prelu glu clamp clamp_min clamp_max clip where masked_fill "
    "minimum maximum fmin fmax lerp addcmul addcdiv eq ne lt le gt ge logical_and logical_or logical_not "
    "logical_xor bitwise_and bitwise_or bitwise_not bitwise_xor __and__ __or__ __xor__ __iand__ __ior__ "
    "nan_to_num isnan isinf isfinite "
    # backward forms, seen by the dispatch front end
    "threshold_backward gelu_backward silu_backward tanh_backward sigmoid_backward hardtanh_backward "
    "hardswish_backward hardsigmoid_backward leaky_relu_backward elu_backward softplus_backward mish_backward "
    "native_dropout_backward"
)
REDUCTION_OPS = _with_inplace(
    "sum mean nansum nanmean var std var_mean std_mean norm linalg_vector_norm frobenius_norm amax amin "
    "max min aminmax prod logsumexp cumsum cumprod all any argmax argmin count_nonzero"
)
SOFTMAX_OPS = _with_inplace("softmax log_softmax _softmax _log_softmax _safe_softmax _softmax_backward_data _log_softmax_backward_data")


@ELEMENTWISE_FLOP_FORMULAS.register(*POINTWISE_OPS)
def pointwise_flops(op: OpRecord) -> int:
    return op.output_numel()


@ELEMENTWISE_FLOP_FORMULAS.register(*REDUCTION_OPS)
def reduction_flops(op: OpRecord) -> int:
    return prod(op.operand_shape())


@ELEMENTWISE_FLOP_FORMULAS.register(*SOFTMAX_OPS)
def softmax_flops(op: OpRecord) -> int:
    return 3 * op.output_numel()
