"""Classes asked about without importing them: an instance of a class can exist only once its
module is imported, so where it is not, the answer is already "no".

The questions a count asks of every model (is it ``torch.compile``'s wrapper, is it sharded by FSDP2
or DTensor, is it an ``ExportedProgram``) are answered this way: importing dynamo and
torch.distributed's modules to ask cost a process's first count 0.4 s (a small CNN's count takes
3 ms), and on torch versions that do not import ``torch.export`` themselves, sympy with it.
"""

from __future__ import annotations

import sys
from typing import Any, Optional


def imported_class(module: str, name: str) -> Optional[type]:
    """``module.name`` where ``module`` is imported; None otherwise (nothing can be an instance of
    it yet), or where that module has no such class (a torch built without distributed)."""
    return getattr(sys.modules.get(module), name, None)


def is_compiled(model: Any) -> bool:
    """Whether ``model`` is ``torch.compile``'s wrapper (asked without importing dynamo)."""
    compiled = imported_class("torch._dynamo.eval_frame", "OptimizedModule")
    return compiled is not None and isinstance(model, compiled)
