"""How a model's calls and kernels become its time, by execution mode.

Every op costs host time (Python, the dispatcher, an allocation: :data:`~jitflops.estimates.devices.HOST_KINDS`
by what the call is) and most a kernel (:mod:`jitflops.estimates.costs`); every module entered costs
the host its call. How they add up depends on where the kernels run and how they are issued:

- ``eager`` on a CPU: one thread issues and computes, so host and kernels take turns: the sum.
- ``eager`` on a GPU: the host issues each kernel and goes on; the GPU runs each kernel once the one
  before it is done and it has been issued. A forward takes the longer of the two streams, with the
  waits between them: small batches wait on the host, large ones on the GPU.
- ``graph`` (CUDA graphs): the kernels are replayed without the host, back to back.
- ``compiled`` (``torch.compile``): the kernels back to back without the host's time per op (the
  compiled wrapper calls them), and each run of consecutive ops inductor writes its own loops for
  (pointwise ops, copies, random draws, norms, softmax, reductions) fused into one kernel: the run
  takes its slowest member's time, its intermediate tensors never written. Products, convolutions,
  attention and gathers stay the library's kernels. The compilation itself is not counted.

:class:`Timeline` keeps both clocks over the ops in the order they run, and gives each op the time
it adds to the forward's end (the sum of those is the forward; per module, its ops' sum).
"""

from __future__ import annotations

from typing import Optional

from ..handles.traffic import METADATA_OPS
from ..handles.zero_cost import aten_kinds
from .costs.attention import ATTENTION_KERNELS
from .costs.convolution import CONVOLUTION_KINDS
from .costs.products import PRODUCT_KINDS
from .costs.reductions import BATCH_NORMS

MODES = ("eager", "graph", "compiled")

SCALAR_OPS = aten_kinds("size Int Float Bool ScalarImplicit IntImplicit FloatImplicit numel dim item _local_scalar_dense sym_size sym_numel sym_stride len")
"""Ops that read a size or a scalar: a Python attribute or a number, not a tensor call."""


LIBRARY_OF = {kind: library for library, kinds in (("product", PRODUCT_KINDS), ("convolution", CONVOLUTION_KINDS), ("batch_norm", BATCH_NORMS),
                                                   ("attention", ATTENTION_KERNELS)) for kind in kinds}
"""Each op kind of a library's call to its :data:`~jitflops.estimates.devices.LIBRARY_CALLS` name."""


def host_kind(kind: str, backward: bool = False) -> Optional[str]:
    """What an eager call of an op of ``kind`` costs the host (:data:`~jitflops.estimates.devices.HOST_KINDS`):
    nothing for a front end's bookkeeping (``prim::``: a JIT graph's constants and lists, the
    dispatch recording's device reads) or a profiler's marker (``profiler::``, what ``Optimizer.step``
    records), the autograd engine's call of a backward op (``backward``: no Python), a size or scalar
    read, a view, a library's call (a product, a convolution, a batch norm, attention), or an op."""
    if kind.startswith(("prim::", "profiler::")):
        return None
    if backward:
        return "backward"
    if kind in SCALAR_OPS:
        return "scalar"
    if kind in METADATA_OPS:
        return "view"
    return LIBRARY_OF.get(kind, "op")


def modules_entered(previous: str, current: str, called: frozenset[str]) -> int:
    """How many of the ``called`` modules an op in module ``current`` entered after an op in
    ``previous`` (dotted names): ``current`` and its owners that do not own ``previous``."""
    if current == previous:
        return 0
    count, name = 0, current
    while name and not (previous == name or previous.startswith(f"{name}.")):
        count += name in called
        name = name.rpartition(".")[0]
    return count


class Timeline:
    """The clocks of one forward (or step) on a device, op by op, in ``mode`` (:data:`MODES`);
    ``overlapped``: the device runs kernels while the host goes on (a GPU), or not (a CPU)."""

    def __init__(self, mode: str = "eager", overlapped: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode, self.overlapped = mode, overlapped
        self.host = self.device = self.end = 0.0
        self._fused: Optional[float] = None
        """Compiled: the slowest kernel of the fused run the last op joined (None: no run open)."""

    def add(self, host_s: float, kernel_s: float, fusible: bool = False) -> float:
        """Run one op (``fusible``: one a compiler fuses with its fusible neighbours): the seconds it adds to the end."""
        if self.mode != "eager":
            host_s = 0.0
        if self.mode == "compiled" and kernel_s:  # an op without a kernel (a view) neither joins a run nor ends it
            if fusible and self._fused is not None:
                kernel_s, self._fused = max(0.0, kernel_s - self._fused), max(self._fused, kernel_s)
            else:
                self._fused = kernel_s if fusible else None
        if not self.overlapped:
            self.end += host_s + kernel_s
            return host_s + kernel_s
        self.host += host_s
        self.device = max(self.host, self.device) + kernel_s if kernel_s else self.device
        end = max(self.host, self.device)
        added, self.end = end - self.end, end
        return added

