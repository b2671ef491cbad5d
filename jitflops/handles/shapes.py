"""Shape helpers shared by formulas, and fvcore's ``get_shape`` for handles written against JIT values."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence


def get_shape(value: Any) -> Optional[list[int]]:
    """The shape of a JIT ``torch._C.Value`` as a list, or None when it is not a complete tensor.

    Same contract as ``fvcore.nn.jit_handles.get_shape``, so fvcore-style handles can import it from here.
    """
    if value.isCompleteTensor():
        return value.type().sizes()
    return None


def prod(values: Sequence[int]) -> int:
    return math.prod(values)
