"""Pooling, upsampling and grid sampling.

* Adaptive pools read every input element once: one flop per input element (fvcore's count for
  ``adaptive_avg_pool2d``, extended to 1-D, 3-D and max).
* Windowed pools (max and average, 1-D to 3-D) do one comparison or addition per window element:
  output elements x kernel size.
* Interpolation weighs the neighbours of each output element: 1 for nearest, 2 for linear,
  4 for bilinear, 8 for trilinear and 16 for bicubic (fvcore counts 1 and 4 for its two 2-D modes).
* ``grid_sampler`` likewise by its interpolation mode and rank (fvcore assumes bilinear: 4).

Backward (dispatch front end): each gradient element goes back along the same windows and
neighbours, so a backward costs what its forward costs.
"""

from __future__ import annotations

from ..core.records import OpRecord
from .registry import FLOP_FORMULAS
from .shapes import prod


@FLOP_FORMULAS.register(
    "aten::adaptive_avg_pool1d", "aten::adaptive_avg_pool2d", "aten::adaptive_avg_pool3d",
    "aten::adaptive_max_pool1d", "aten::adaptive_max_pool2d", "aten::adaptive_max_pool3d",
    "aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool3d",
    "aten::_adaptive_avg_pool2d_backward", "aten::_adaptive_avg_pool3d_backward",
    "aten::adaptive_max_pool2d_backward", "aten::adaptive_max_pool3d_backward",
)
def adaptive_pool_flops(op: OpRecord) -> int:
    """The input (``self``; the backward's second argument) is read once."""
    return prod(op.shape("self"))


_POOL_SPATIAL_DIMS = {
    "aten::max_pool1d": 1, "aten::max_pool2d": 2, "aten::max_pool3d": 3,
    "aten::avg_pool1d": 1, "aten::avg_pool2d": 2, "aten::avg_pool3d": 3,
    "aten::max_pool1d_with_indices": 1, "aten::max_pool2d_with_indices": 2, "aten::max_pool3d_with_indices": 3,
    "aten::fractional_max_pool2d": 2, "aten::fractional_max_pool3d": 3,
}


_POOL_BACKWARD_SPATIAL_DIMS = {
    "aten::max_pool2d_with_indices_backward": 2, "aten::max_pool3d_with_indices_backward": 3,
    "aten::avg_pool2d_backward": 2, "aten::avg_pool3d_backward": 3,
    "aten::fractional_max_pool2d_backward": 2, "aten::fractional_max_pool3d_backward": 3,
}


def _kernel_elements(op: OpRecord, spatial_dims: int) -> int:
    kernel = op.arg("kernel_size")
    if isinstance(kernel, int):
        kernel = [kernel]
    if len(kernel) == 1:
        kernel = list(kernel) * spatial_dims
    return prod(kernel)


@FLOP_FORMULAS.register(*_POOL_SPATIAL_DIMS)
def windowed_pool_flops(op: OpRecord) -> int:
    return op.output_numel() * _kernel_elements(op, _POOL_SPATIAL_DIMS[op.kind])


@FLOP_FORMULAS.register(*_POOL_BACKWARD_SPATIAL_DIMS)
def windowed_pool_backward_flops(op: OpRecord) -> int:
    return prod(op.shape("grad_output")) * _kernel_elements(op, _POOL_BACKWARD_SPATIAL_DIMS[op.kind])


def _interpolation(per_output_element: int):
    def formula(op: OpRecord) -> int:
        return op.output_numel() * per_output_element

    formula.__doc__ = f"{per_output_element} flop(s) per output element."
    return formula


def _interpolation_backward(per_output_element: int):
    def formula(op: OpRecord) -> int:
        return prod(op.shape("grad_output")) * per_output_element

    formula.__doc__ = f"{per_output_element} flop(s) per element of the output gradient."
    return formula


for _kinds, _neighbours in (
    (("aten::upsample_nearest1d", "aten::upsample_nearest2d", "aten::upsample_nearest3d",
      "aten::_upsample_nearest_exact1d", "aten::_upsample_nearest_exact2d", "aten::_upsample_nearest_exact3d"), 1),
    (("aten::upsample_linear1d",), 2),
    (("aten::upsample_bilinear2d", "aten::_upsample_bilinear2d_aa"), 4),
    (("aten::upsample_trilinear3d",), 8),
    (("aten::upsample_bicubic2d", "aten::_upsample_bicubic2d_aa"), 16),
):
    FLOP_FORMULAS.register(*_kinds)(_interpolation(_neighbours))
    FLOP_FORMULAS.register(*(f"{kind}_backward" for kind in _kinds))(_interpolation_backward(_neighbours))

INTERPOLATION_NEIGHBOURS = {"nearest": 1, "nearest-exact": 1, "linear": 2, "bilinear": 4, "trilinear": 8, "bicubic": 16, "area": 1}
"""``F.interpolate``'s modes and the neighbours each output element weighs."""


@FLOP_FORMULAS.register("jitflops::resample")
def symbolic_resample_flops(op: OpRecord) -> int:
    """``F.interpolate`` to sizes in symbols (:mod:`jitflops.engine.symbolic_counts`), by its mode."""
    return op.output_numel() * INTERPOLATION_NEIGHBOURS[op.arg("mode")]


_GRID_SAMPLE_NEIGHBOURS = {  # (interpolation_mode, spatial dims) -> neighbours per output element
    (0, 2): 4, (1, 2): 1, (2, 2): 16,  # bilinear, nearest, bicubic
    (0, 3): 8, (1, 3): 1,  # trilinear, nearest
}


def _grid_sample_neighbours(op: OpRecord) -> int:
    spatial_dims = len(op.shape("input")) - 2
    return _GRID_SAMPLE_NEIGHBOURS.get((op.arg("interpolation_mode"), spatial_dims), 4)


@FLOP_FORMULAS.register("aten::grid_sampler", "aten::grid_sampler_2d", "aten::grid_sampler_3d")
def grid_sample_flops(op: OpRecord) -> int:
    return op.output_numel() * _grid_sample_neighbours(op)


@FLOP_FORMULAS.register("aten::grid_sampler_2d_backward", "aten::grid_sampler_3d_backward")
def grid_sample_backward_flops(op: OpRecord) -> int:
    """Each element of the output gradient goes back to the neighbours it was sampled from."""
    return prod(op.shape("grad_output")) * _grid_sample_neighbours(op)
