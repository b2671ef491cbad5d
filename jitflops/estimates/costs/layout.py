"""Copies eager code makes only to change a tensor's layout, as the dispatch backend records them:
a ``clone`` to the contiguous format (what ``contiguous`` of a tensor that is not, and a ``reshape``
that cannot be a view, run), a layer norm's copy of an input that is not contiguous, and a
convolution's of an input or weight not in the memory format torch suggests for them (SegFormer's
``transpose(1, 2).view(...)`` before its depthwise convolution: ``_convolution`` runs ``contiguous``
first). The traffic formulas leave them out, a count's convention (:mod:`jitflops.handles.traffic`);
the time has them, where the front end recorded the strides the tensor had as it ran (the dispatch
backend's fake tensors; a meta tensor's are its meta kernel's, not the device's, and the JIT's meta
copy records none). A copy whose source is strided in its innermost dimension transposes: the spec's
``transpose`` curve prices it (on a CPU five to ten times a ``clone``'s time an element); any other
(a slice's, a permutation of the outer dimensions) a copy's."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch._prims_common import suggest_memory_format

from ...core.records import OpRecord, TensorMeta
from ..devices import DeviceSpec
from ..measured_curves import curve_seconds
from .registry import CostTable, curve_of, roofline_seconds

LayoutSource = Callable[[OpRecord], tuple[TensorMeta, ...]]
"""record -> the tensors the op copies to change their layout (none: it copies nothing so)."""

LAYOUT_COPIES: CostTable[LayoutSource] = CostTable()

_CHANNELS_LAST = (torch.channels_last, torch.channels_last_3d)


def _strided(meta: object) -> Optional[torch.Tensor]:
    """An empty meta tensor with ``meta``'s shape and strides (None: they were not recorded)."""
    if not isinstance(meta, TensorMeta) or meta.shape is None or meta.strides is None or len(meta.strides) != len(meta.shape):
        return None
    if not all(isinstance(size, int) for size in (*meta.shape, *meta.strides)):
        return None
    return torch.empty_strided(meta.shape, meta.strides, device="meta")


@LAYOUT_COPIES.register("aten::clone")
def clone_sources(op: OpRecord) -> tuple[TensorMeta, ...]:
    """A clone to the contiguous format (``contiguous`` and a copying ``reshape`` under the dispatch
    backend) is the layout copy the traffic formulas leave out, where the strides that made it were
    recorded (a meta tensor may be copied where the device's is not); any other clone they count."""
    copied = _strided(op.input(0)) is not None and op.arg_or("memory_format", None) == torch.contiguous_format
    return (op.input(0),) if copied else ()


@LAYOUT_COPIES.register("aten::native_layer_norm")
def layer_norm_sources(op: OpRecord) -> tuple[TensorMeta, ...]:
    """A layer norm makes its input contiguous first (SegFormer's, on a transposed sequence of patches)."""
    tensor = _strided(op.input(0))
    return (op.input(0),) if tensor is not None and not tensor.is_contiguous() else ()


@LAYOUT_COPIES.register("aten::convolution")
def convolution_sources(op: OpRecord) -> tuple[TensorMeta, ...]:
    """A convolution runs channels-last where torch suggests that format for its input or its weight,
    else contiguous, and copies the one of them not in it. torch suggests a format by the strides'
    order, the size-1 batch's too: SegFormer's ``transpose(1, 2).view(...)`` gives its batch a
    stride below the rows', so it is copied, where ConvNeXt's ``permute`` is read as it is."""
    x, w = _strided(op.input(0)), _strided(op.input(1))
    if x is None or w is None:
        return ()
    suggested = {suggest_memory_format(x), suggest_memory_format(w)} & set(_CHANNELS_LAST)
    memory_format = suggested.pop() if suggested else torch.contiguous_format
    return tuple(meta for meta, tensor in ((op.input(0), x), (op.input(1), w)) if not tensor.is_contiguous(memory_format=memory_format))


def layout_copy_seconds(op: OpRecord, spec: DeviceSpec) -> float:
    """The seconds of the copy ``op`` makes to change a tensor's layout (0: none)."""
    find = LAYOUT_COPIES.get(op.kind)
    return sum(_copy_seconds(source, spec) for source in (find(op) if find is not None else ()) if source.shape is not None)


def _copy_seconds(source: TensorMeta, spec: DeviceSpec) -> float:
    """A copy of ``source`` to a contiguous layout: a transposition where its innermost dimension is strided."""
    tensor = _strided(source)
    innermost = [stride for size, stride in zip(tensor.shape, tensor.stride()) if size > 1][-1:] if tensor is not None else [1]
    curve = (curve_of(spec, "transpose") if innermost != [1] else None) or curve_of(spec, "copy")
    if curve is not None:
        return curve_seconds(curve, source.numel)
    width = source.dtype.itemsize if source.dtype is not None else 4  # no curve (a datasheet device): its bytes read and written
    return roofline_seconds(0.0, 2.0 * source.numel * width, spec.peak_for(source.dtype), spec)
