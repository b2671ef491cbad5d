"""Elementwise arithmetic, activations, reductions and softmax.

These ops are *known*: they never appear as unsupported. By default they count zero, as in fvcore,
so that published numbers reproduce; ``FlopCountAnalysis(..., elementwise=True)`` counts them with
these formulas:

* pointwise ops (arithmetic, comparisons, activations, selections): 1 flop per output element;
* reductions (sum, mean, var, norm, max, ...): 1 flop per input element;
* softmax and log-softmax: 3 flops per element (exponent, sum, divide);
* accumulating scatters (``index_add``, ``scatter_add``, ``scatter_reduce``, ``embedding_bag``, ...):
  1 flop per element added in;
* losses and row-wise distances, as their compositions: a few flops per element of the input
  (``LOSS_FLOPS_PER_ELEMENT``: the subtraction, square or log, and the reduction of ``mse_loss`` are 3).

The backward forms the dispatch front end sees count like their forward ops: activations'
(``gelu_backward``, ``threshold_backward``, ...) 1 flop per element, losses' the flops per element of
their forward (``mse_loss_backward``: 3), and the gradients that add up what the forward copied or
looked up (a padding's borders, overlapping ``unfold`` windows, ``embedding_bag``'s rows, segments)
1 flop per element added in.
"""

from __future__ import annotations

from ..core.records import OpRecord
from .registry import ELEMENTWISE_FLOP_FORMULAS, with_inplace
from .shapes import prod


POINTWISE_OPS = with_inplace(
    "add sub rsub mul div true_divide floor_divide remainder fmod neg pow square sqrt rsqrt reciprocal "
    "exp exp2 expm1 log log2 log10 log1p abs sign floor ceil round trunc frac "
    "sin cos tan asin acos atan atan2 sinh cosh tanh erf erfc erfinv sigmoid logit "
    "relu relu6 gelu silu mish hardtanh hardswish hardsigmoid leaky_relu elu selu celu softplus softshrink "
    "hardshrink tanhshrink softsign threshold prelu glu clamp clamp_min clamp_max clip where masked_fill "
    "minimum maximum fmin fmax lerp addcmul addcdiv eq ne lt le gt ge logical_and logical_or logical_not "
    "logical_xor bitwise_and bitwise_or bitwise_not bitwise_xor __and__ __or__ __xor__ __iand__ __ior__ "
    "nan_to_num isnan isinf isfinite "
    "acosh asinh atanh arccosh arcsinh arctanh arcsin arccos arctan arctan2 angle sgn copysign deg2rad rad2deg frexp ldexp "
    "float_power heaviside hypot i0 igamma igammac lgamma digamma polygamma mvlgamma nextafter sinc xlogy logaddexp "
    "logaddexp2 diff gradient signbit isneginf isposinf isreal isclose isin conj_physical kron cross linalg_cross "
    "_prelu_kernel log_sigmoid log_sigmoid_forward rrelu rrelu_with_noise polar linalg_vander negative multiply divide "
    "subtract not_equal greater greater_equal less less_equal absolute fix "
    # backward forms, seen by the dispatch front end
    "threshold_backward gelu_backward silu_backward tanh_backward sigmoid_backward hardtanh_backward "
    "hardswish_backward hardsigmoid_backward leaky_relu_backward elu_backward softplus_backward mish_backward "
    "native_dropout_backward hardshrink_backward softshrink_backward logit_backward log_sigmoid_backward "
    "rrelu_with_noise_backward glu_backward _prelu_kernel_backward"
) + [f"aten::special_{name}" for name in (
    "airy_ai bessel_j0 bessel_j1 bessel_y0 bessel_y1 chebyshev_polynomial_t chebyshev_polynomial_u chebyshev_polynomial_v "
    "chebyshev_polynomial_w digamma entr erf erfc erfcx erfinv exp2 expit expm1 gammainc gammaincc gammaln "
    "hermite_polynomial_h hermite_polynomial_he i0 i0e i1 i1e laguerre_polynomial_l legendre_polynomial_p log1p log_ndtr "
    "logit modified_bessel_i0 modified_bessel_i1 modified_bessel_k0 modified_bessel_k1 multigammaln ndtr ndtri polygamma "
    "psi round scaled_modified_bessel_k0 scaled_modified_bessel_k1 shifted_chebyshev_polynomial_t "
    "shifted_chebyshev_polynomial_u shifted_chebyshev_polynomial_v shifted_chebyshev_polynomial_w sinc "
    "spherical_bessel_j0 xlog1py xlogy zeta"
).split()]
REDUCTION_OPS = with_inplace(
    "sum mean nansum nanmean var std var_mean std_mean norm linalg_vector_norm frobenius_norm amax amin "
    "max min aminmax prod logsumexp cumsum cumprod all any argmax argmin count_nonzero "
    "cummax cummin logcumsumexp renorm sum_to_size trace trapezoid trapz cumulative_trapezoid allclose equal hash_tensor "
    "_weight_norm _weight_norm_interface special_logsumexp _is_all_true _is_any_true"
)
SOFTMAX_OPS = with_inplace(
    "softmax log_softmax _softmax _log_softmax _safe_softmax _softmax_backward_data _log_softmax_backward_data "
    "special_softmax special_log_softmax"
)
ACCUMULATED_OPERAND = {
    **{kind: "source" for kind in with_inplace("index_add index_reduce")},
    **{kind: "src" for kind in with_inplace("scatter_add scatter_reduce")},
    "aten::_unsafe_masked_index_put_accumulate": "values",
    "aten::segment_reduce": "data",
    "aten::col2im": "self",
    # backward forms: the output gradient added into the input gradient where the forward copied or reused values
    "aten::_segment_reduce_backward": "data",
    "aten::unfold_backward": "grad_in",
    **{f"aten::{kind}_pad{rank}d_backward": "grad_output" for kind in ("reflection", "replication") for rank in (1, 2, 3)},
}
"""Scatters that add (or reduce) one operand into another: which argument is added in."""

LOSS_FLOPS_PER_ELEMENT = {
    **dict.fromkeys(("mse_loss", "l1_loss", "kl_div", "poisson_nll_loss", "hinge_embedding_loss", "multi_margin_loss",
                     "multilabel_margin_loss", "multilabel_margin_loss_forward", "pairwise_distance", "dist"), 3),
    **dict.fromkeys(("smooth_l1_loss", "huber_loss", "soft_margin_loss", "margin_ranking_loss", "cross_entropy_loss"), 4),
    **dict.fromkeys(("binary_cross_entropy", "binary_cross_entropy_with_logits", "cosine_similarity",
                     "cosine_embedding_loss", "triplet_margin_loss"), 6),
    **dict.fromkeys(("nll_loss", "nll_loss_nd", "nll_loss2d", "nll_loss_forward", "nll_loss2d_forward", "ctc_loss", "_ctc_loss"), 1),
}
"""Flops per element of a loss's (or row-wise distance's) first input: its elementwise steps and reduction."""

LOSS_BACKWARD_INPUT = {
    **{f"aten::{loss}_backward": (loss, "self") for loss in (
        "mse_loss", "binary_cross_entropy", "smooth_l1_loss", "huber_loss", "soft_margin_loss", "multi_margin_loss",
        "multilabel_margin_loss", "nll_loss", "nll_loss2d")},
    "aten::_ctc_loss_backward": ("_ctc_loss", "log_probs"),
}
"""A loss's backward kernel: the forward it counts as, and its argument that was the forward's input."""


@ELEMENTWISE_FLOP_FORMULAS.register(*POINTWISE_OPS)
def pointwise_flops(op: OpRecord) -> int:
    return op.output_numel()


@ELEMENTWISE_FLOP_FORMULAS.register(*REDUCTION_OPS)
def reduction_flops(op: OpRecord) -> int:
    return prod(op.operand_shape())


@ELEMENTWISE_FLOP_FORMULAS.register(*SOFTMAX_OPS)
def softmax_flops(op: OpRecord) -> int:
    return 3 * op.output_numel()


@ELEMENTWISE_FLOP_FORMULAS.register(*ACCUMULATED_OPERAND)
def accumulate_flops(op: OpRecord) -> int:
    return prod(op.shape(ACCUMULATED_OPERAND[op.kind]))


@ELEMENTWISE_FLOP_FORMULAS.register(
    "aten::embedding_bag", "aten::_embedding_bag", "aten::_embedding_bag_forward_only", "aten::_embedding_bag_per_sample_weights_backward",
)
def embedding_bag_flops(op: OpRecord) -> int:
    """Every looked-up row is added into its bag (the backward for ``per_sample_weights``: the output
    gradient's dot product with each looked-up row)."""
    return prod(op.shape("indices")) * op.shape("weight")[-1]


@ELEMENTWISE_FLOP_FORMULAS.register("aten::_embedding_bag_backward")
def embedding_bag_backward_flops(op: OpRecord) -> int:
    """Every bag's gradient row is added into the gradient of each row it looked up."""
    return prod(op.shape("indices")) * op.shape("grad")[-1]


@ELEMENTWISE_FLOP_FORMULAS.register(*(f"aten::{name}" for name in LOSS_FLOPS_PER_ELEMENT))
def loss_flops(op: OpRecord) -> int:
    return LOSS_FLOPS_PER_ELEMENT[op.kind.removeprefix("aten::")] * prod(op.operand_shape())


@ELEMENTWISE_FLOP_FORMULAS.register(*LOSS_BACKWARD_INPUT)
def loss_backward_flops(op: OpRecord) -> int:
    forward, operand = LOSS_BACKWARD_INPUT[op.kind]
    return LOSS_FLOPS_PER_ELEMENT[forward] * prod(op.shape(operand))
