"""What a kernel cost reads of an op's operands: the dtype it computes in, the elements it writes and reads."""

from __future__ import annotations

from typing import Optional

import torch

from ...core.records import OpRecord, TensorMeta


def compute_dtype(op: OpRecord) -> Optional[torch.dtype]:
    """The dtype an op computes in: its first floating-point (else first) tensor input's."""
    tensors = [value for value in op.inputs if isinstance(value, TensorMeta) and value.dtype is not None]
    floating = [value.dtype for value in tensors if value.dtype.is_floating_point]
    return floating[0] if floating else (tensors[0].dtype if tensors else None)


def output_elements(op: OpRecord) -> int:
    """Elements of the op's first tensor output (an in-place op's: its target's)."""
    for value in op.outputs:
        if isinstance(value, TensorMeta) and value.shape is not None:
            return value.numel
    return 0


def input_elements(op: OpRecord) -> int:
    """Elements of the op's first tensor input."""
    for value in op.inputs:
        if isinstance(value, TensorMeta) and value.shape is not None:
            return value.numel
    return 0
