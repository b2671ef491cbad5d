"""Checks of a tensor's values, taken as passing on tensors that have none.

``torch._check_tensor_all(cond)`` reads whether a boolean tensor is all true:
``cond._is_all_true().item()``. transformers' ``torch_compilable_check`` (in 334 of its modules in
5.25) calls it with a tensor condition, traced or not: ProphetNet's n-gram attention checks its
position ids at every decode step. A meta or fake tensor has no value to answer with, and the check
only guards the run: it does not change a shape or an op. On those tensors it is taken as passing,
as the model's own run on values passes it; any other value read still fails as before.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor

CHECKS = frozenset({torch.ops.aten._is_all_true.default, torch.ops.aten._is_any_true.default})
"""The ops that fold a boolean tensor into the one value a check reads."""

READ = torch.ops.aten._local_scalar_dense.default


class ValueChecks:
    """The outputs of :data:`CHECKS` without values seen so far (held weakly), and the answer to their reading."""

    def __init__(self) -> None:
        self._checks: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()

    def after(self, func: Any, output: Any) -> None:
        """Notes ``output`` of ``func`` where it is a check's, on a tensor without values."""
        if func in CHECKS and isinstance(output, torch.Tensor) and (output.is_meta or isinstance(output, FakeTensor)):
            self._checks[id(output)] = output

    def answer(self, func: Any, args: tuple) -> Optional[bool]:
        """True where ``func`` reads a noted check's value; None otherwise (the op runs)."""
        if func is READ and args and self._checks.get(id(args[0])) is args[0]:
            return True
        return None
