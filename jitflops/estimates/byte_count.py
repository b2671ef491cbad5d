"""Memory traffic: the bytes each op reads and writes, per module and per operator, in fvcore's shape.

The convention (:mod:`jitflops.handles.traffic`, ``docs/conventions.md``) is each op's compulsory
traffic as one kernel: inputs read once, outputs written once, views free, gathers reading only the
rows they use. Every op moves bytes, so every op has a count: its family's formula, or its tensors
read and written; only ops that move nothing are known zeros. Both front ends, the meta device and
``compute=False`` work as for FLOPs.

>>> traffic = ByteCountAnalysis(model, inputs)
>>> traffic.total(), traffic.by_operator(), traffic.by_module(), traffic.by_module_and_operator()
"""

from __future__ import annotations

from typing import Mapping

from ..engine.counting import Statistics, statistics_of
from ..handles import Handle
from ..handles.traffic import BYTES_FORMULAS, METADATA_OPS, TrafficFormulas
from ..engine.jit_analysis import JitModelAnalysis
from ..core.op_source import OpSource

_DEFAULT_SUPPORTED_OPS: dict[str, Handle] = BYTES_FORMULAS.handles()
"""The family formulas every new ``ByteCountAnalysis`` starts from; every other op reads and writes its tensors."""


class ByteCountAnalysis(JitModelAnalysis):
    """Bytes read and written per module and per operator (fvcore's API: ``total()``,
    ``by_operator()``, ``by_module()``, ``by_module_and_operator()``, ``unsupported_ops()``).

    An op without a family formula reads its tensor inputs and writes its tensor outputs; ops that
    move nothing (views, sizes, allocations) count zero. ``set_op_handle`` overrides either.
    """

    @classmethod
    def _default_handles(cls) -> Mapping[str, Handle]:
        return _DEFAULT_SUPPORTED_OPS

    @classmethod
    def _default_ignored_ops(cls) -> frozenset[str]:
        return METADATA_OPS

    def _analyze(self, trace: OpSource) -> Statistics:
        handles = TrafficFormulas(self._op_handles, self._ignored_ops)
        return statistics_of(trace, handles, self._ignored_ops, self._aliases, self._ancestor_mode)
