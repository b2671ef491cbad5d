"""The host's time per eager call, by kind: what a forward spends before (a GPU) or besides (a CPU)
its kernels.

Timed as the median per call of a loop of many: a tiny op that dispatches a kernel (``torch.add``
of two one-element tensors: Python, the dispatcher and an allocation), a view (``view``), a read of
a size (``size(0)``), a call of a module that does nothing (``nn.Module.__call__``'s machinery),
the backward of a chain of tiny products (the autograd engine's call of each backward op),
DTensor's dispatch of an op, alone and in a tensor-parallel module (:func:`_dtensor_per_op`), and
FSDP2's hooks per unit and per parameter tensor (:func:`_fsdp_per_unit`), on a CPU a page of a
block mapped afresh faulted in (:func:`per_fresh_page`), and on a GPU a tiny op of each library a
call plans with (:func:`_library_calls`); and a model's Python, an instruction at a time, timed
between the ops of a tour of tiny ops of many kinds (:func:`_per_bytecode`).
On a GPU the loop is synchronised once at its end: each op's time is what the host takes to issue
it, where the kernel is tinier than that.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ...estimates.costs.fresh_pages import FRESH_PAGES_FROM_BYTES, PAGE_BYTES
from ..timed_pass import faults_since, minor_faults
from .budget import CallTimer, synchronize

CALLS = 2000
"""Calls per timed loop; the median of 5 loops is taken."""


def _per_call(device: torch.device, run: Callable[[], object], calls: int = CALLS) -> float:
    return _per_call_interleaved(device, [run], calls)[0]


def _per_call_interleaved(device: torch.device, runs: list[Callable[[], object]], calls: int = CALLS) -> list[float]:
    """Each of ``runs``' seconds a call: the median of 5 loops of ``calls`` calls, the runs' loops in
    turn, so that a slow stretch of a shared machine falls on each a little (FSDP2's time a
    tensor, a difference of four such times, came out 0 once in three calibrations timed one run
    after the other)."""
    for run in runs:
        for _ in range(max(calls // 20, 10)):
            run()
    samples: list[list[float]] = [[] for _ in runs]
    for _ in range(5):
        for run, times in zip(runs, samples):
            synchronize(device)
            start = time.perf_counter()
            for _ in range(calls):
                run()
            synchronize(device)
            times.append((time.perf_counter() - start) / calls)
    return [statistics.median(times) for times in samples]


STEP_CALLS = 100
"""Calls per timed loop of an optimizer's step (0.05 to 0.3 ms each on a 2-core EPYC)."""

PASS_CALLS = 20
"""Calls per timed loop of a tiny MLP's forward and backward (about 0.2 and 1.5 ms each, plain and
tensor-parallel, on a 2-core EPYC): the DTensor timings take half a second in all."""

BACKWARD_CHAIN = 200
"""Tiny ops in the chain whose backward times the autograd engine's call of a backward op."""


def _backward_per_op(device: torch.device) -> float:
    leaf = torch.ones(1, device=device, requires_grad=True)

    def chain() -> torch.Tensor:
        x = leaf
        for _ in range(BACKWARD_CHAIN):
            x = x * 1.0
        return x.sum()
    samples = []
    for _ in range(5):
        loss = chain()
        synchronize(device)
        start = time.perf_counter()
        loss.backward()
        synchronize(device)
        samples.append((time.perf_counter() - start) / (BACKWARD_CHAIN + 1))
    return statistics.median(samples)


PARALLEL_WIDTH = 8
"""The width of the tiny tensor-parallel MLP (its hidden layer four times it) that times DTensor in a parallel module."""


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(PARALLEL_WIDTH, 4 * PARALLEL_WIDTH), nn.GELU(), nn.Linear(4 * PARALLEL_WIDTH, PARALLEL_WIDTH))


def _parallel_mlp(mesh: Any, device: torch.device) -> nn.Sequential:
    """:func:`_mlp` by Megatron's tensor-parallel plan (column-wise, then row-wise) on ``mesh``: its
    parameters made DTensors first, so that no process group is needed to scatter them."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mlp = _mlp().to(device)
    for index, (weight, bias) in ((0, (Shard(0), Shard(0))), (2, (Shard(1), Replicate()))):
        layer = mlp[index]
        layer.weight = nn.Parameter(DTensor.from_local(layer.weight.detach(), mesh, [weight], run_check=False))
        layer.bias = nn.Parameter(DTensor.from_local(layer.bias.detach(), mesh, [bias], run_check=False))
    return parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def _adamw_step(parameter: nn.Parameter) -> Callable[[], object]:
    """A steady step of AdamW (per tensor) on ``parameter``, its state made."""
    parameter.grad = torch.zeros_like(parameter)
    optimizer = torch.optim.AdamW([parameter], foreach=False)
    optimizer.step()
    return optimizer.step


def _dtensor_per_op(device: torch.device) -> dict[str, float]:
    """DTensor's host time per op beyond the op's own, where torch has DTensor, on a mesh of this one
    rank built without a process group (a run under ``torchrun`` calibrates beside its own), per
    DTensor op its recording counts: ``dtensor``, AdamW's step on a tiny DTensor parameter less on a
    plain one (an optimizer's ops are most of the DTensor ops outside a parallel module);
    ``parallel_dtensor``, a tiny tensor-parallel MLP's forward and backward less the plain MLP's (on
    a 2-core EPYC 19-44 and 40-54 us, against 1.2-2.4 for a plain op's call)."""
    if not torch.distributed.is_available():
        return {}
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate

    from ...core.model_io import ModelCall
    from ...engine.counting import module_aliases
    from ...estimates.training_step_time import optimizer_dtensor_ops
    from ...frontends.dispatch_trace import record_with_dispatch

    mesh = DeviceMesh(device.type, [0], _init_backend=False, _rank=0)
    plain_step = _adamw_step(nn.Parameter(torch.zeros(2, 2, device=device)))
    dtensor_step = _adamw_step(nn.Parameter(DTensor.from_local(torch.zeros(2, 2, device=device), mesh, [Replicate()], run_check=False)))
    dtensor_s, plain_step_s = _per_call_interleaved(device, [dtensor_step, plain_step], calls=STEP_CALLS)
    per_step = dtensor_s - plain_step_s
    plain, parallel = _mlp().to(device), _parallel_mlp(mesh, device)
    inputs = torch.randn(2, 4, PARALLEL_WIDTH, device=device)
    recording = record_with_dispatch(parallel, ModelCall((inputs,), {}), module_aliases(parallel), lambda output: output.sum().backward(), guarded=False)
    dispatched = sum(record.dtensor_ops for _, record in recording.records)
    parallel_s, plain_s = _per_call_interleaved(device, [lambda: parallel(inputs).sum().backward(), lambda: plain(inputs).sum().backward()], calls=PASS_CALLS)
    per_pass = parallel_s - plain_s
    return {"dtensor": max(0.0, per_step / sum(optimizer_dtensor_ops("adamw"))), "parallel_dtensor": max(0.0, per_pass / dispatched)}


FSDP_UNITS = 4
"""Units of the tiny models whose forward and backward under FSDP2 time its host time."""

FSDP_LINEARS = (1, 6)
"""The linears of each unit of the two tiny models: their parameter tensors apart, their units alike."""


def _fsdp_per_unit(device: torch.device) -> dict[str, float]:
    """FSDP2's host time in a forward and backward beyond the plain model's (its hooks: gathering
    each unit's parameters, copying them in and out, resharding, reducing the gradients), per unit
    (``fsdp_unit``) and per parameter tensor (``fsdp_tensor``), on a fake process group of 2 ranks
    (no data moves): two tiny models of :data:`FSDP_UNITS` units of :data:`FSDP_LINEARS` linears,
    the root holding one more, solve for both (on a 2-core EPYC 0.57-0.64 ms a unit and 23-32 us a
    tensor). On a CPU, where no process group exists yet (the fake one is the default group): a
    run under ``torchrun`` has its own, and a GPU's hooks run ahead of its kernels."""
    if device.type != "cpu" or not torch.distributed.is_available() or torch.distributed.is_initialized():
        return {}
    from torch.distributed.fsdp import fully_shard

    from ...estimates.fake_sharding import fake_process_group

    def model(linears: int) -> nn.Sequential:
        return nn.Sequential(*[nn.Sequential(*[nn.Linear(PARALLEL_WIDTH, PARALLEL_WIDTH) for _ in range(linears)]) for _ in range(FSDP_UNITS)],
                             nn.Linear(PARALLEL_WIDTH, PARALLEL_WIDTH))

    inputs = torch.randn(2, PARALLEL_WIDTH)
    runs: list[Callable[[], object]] = []
    tensors = []
    with fake_process_group(2) as mesh:
        for linears in FSDP_LINEARS:
            plain, sharded = model(linears), model(linears)
            tensors.append(len(list(plain.parameters())))
            for unit in sharded[:FSDP_UNITS]:
                fully_shard(unit, mesh=mesh)
            fully_shard(sharded, mesh=mesh)
            runs += [lambda sharded=sharded: sharded(inputs).sum().backward(), lambda plain=plain: plain(inputs).sum().backward()]
        times = _per_call_interleaved(device, runs, calls=PASS_CALLS)
    extra = [times[0] - times[1], times[2] - times[3]]
    per_tensor = max(0.0, (extra[1] - extra[0]) / (tensors[1] - tensors[0]))
    return {"fsdp_unit": max(0.0, (extra[0] - tensors[0] * per_tensor) / (FSDP_UNITS + 1)), "fsdp_tensor": per_tensor}


FRESH_BLOCK = 2 * FRESH_PAGES_FROM_BYTES
"""The block whose pages time a fresh mapping's: twice the size glibc maps afresh."""

FRESH_SAMPLES = 3

FRESH_TRIES = 8
"""Blocks tried for each sample of a fresh one: a block the heap serves from memory it already holds
(a process that freed 64 MiB or more in one piece) faults nothing, and is held while the next is tried."""


def _fresh_fill_seconds(timer: CallTimer) -> Optional[float]:
    """The time of a new :data:`FRESH_BLOCK`'s allocation, fill and release, from a block that the
    OS faulted in (nine in ten of its pages at least), or None where :data:`FRESH_TRIES` blocks in
    turn came from memory the heap held."""
    heap_served = []  # kept until the return, so that the heap cannot serve the next try from them
    for _ in range(FRESH_TRIES):
        before = minor_faults()
        seconds = timer.seconds(lambda: torch.empty(FRESH_BLOCK, dtype=torch.uint8).fill_(1))
        if (faults_since(before) or 0) >= 0.9 * FRESH_BLOCK / PAGE_BYTES:
            return seconds
        heap_served.append(torch.empty(FRESH_BLOCK, dtype=torch.uint8))
    return None


def per_fresh_page(device: torch.device) -> dict[str, float]:
    """On a CPU, the OS's time faulting in a page of a block mapped afresh (``page``:
    :mod:`~jitflops.estimates.costs.fresh_pages`): a fill of a new :data:`FRESH_BLOCK` less a fill
    of one held, the least of :data:`FRESH_SAMPLES` of each, over its pages (0.8 to 1.1 us on a 2-core
    EPYC; a VM whose host takes freed pages back faults ten times slower at times, a second or more).
    Nothing where no new block faulted (an allocator that keeps freed memory: jemalloc, tcmalloc)."""
    if device.type != "cpu" or minor_faults() is None:  # no count of faults: Windows, which maps no block afresh as glibc does
        return {}
    held, timer = torch.empty(FRESH_BLOCK, dtype=torch.uint8), CallTimer(device, flush=False)
    held.fill_(0)
    fresh, kept = [], []
    for _ in range(FRESH_SAMPLES):
        if (seconds := _fresh_fill_seconds(timer)) is not None:
            fresh.append(seconds)
        kept.append(timer.seconds(lambda: held.fill_(1)))
    return {"page": max(0.0, min(fresh) - min(kept)) * PAGE_BYTES / FRESH_BLOCK} if fresh else {}


LIBRARY_CALLS_PER_LOOP = 500
"""Calls per timed loop of a library's op (20 to 50 us each on an H200's host)."""


def _library_calls(device: torch.device) -> dict[str, float]:
    """On a GPU, the host's time per call of a tiny op of each library
    (:data:`~jitflops.estimates.devices.LIBRARY_CALLS`): a product with a bias, a 3 x 3 convolution,
    a batch norm in eval and attention, in float32, whose kernels are tinier than their calls. On a
    CPU, none: each family's curve is timed with its call."""
    if device.type != "cuda":
        return {}
    x, weight, bias = torch.randn(4, 8, device=device), torch.randn(8, 8, device=device), torch.randn(8, device=device)
    image, filters = torch.randn(1, 4, 8, 8, device=device), torch.randn(4, 4, 3, 3, device=device)
    mean, variance = torch.zeros(4, device=device), torch.ones(4, device=device)
    heads = torch.randn(1, 2, 8, 16, device=device)
    calls: dict[str, Callable[[], object]] = {
        "product": lambda: F.linear(x, weight, bias), "convolution": lambda: F.conv2d(image, filters, padding=1),
        "batch_norm": lambda: F.batch_norm(image, mean, variance), "attention": lambda: F.scaled_dot_product_attention(heads, heads, heads)}
    return {library: _per_call(device, call, LIBRARY_CALLS_PER_LOOP) for library, call in calls.items()}


@dataclass
class _Output:
    """A model's output as transformers returns it: a dataclass of optional fields."""

    hidden: Any
    cache: Any = None
    extra: Optional[dict[str, Any]] = None


class _Glue(nn.Module):
    """A module whose forward is Python alone, as a model's runs between its ops: its input's sizes,
    dtype and device read, torch's mode checks, its own and its children's attributes read
    (``nn.Module.__getattr__``), keyword arguments passed on, a cache kept, a dataclass made (no
    op: the input comes back)."""

    def __init__(self) -> None:
        super().__init__()
        self.heads, self.width, self.scale = 4, 64, 0.125
        self.child = nn.Identity()

    def _options(self, hidden: torch.Tensor, cache: Optional[list[Any]] = None, **kwargs: Any) -> dict[str, Any]:
        if cache is not None and kwargs.get("use_cache", True):
            cache.append((hidden.shape[:-1], self.heads, self.width))
            del cache[:-2]
        tracing = torch.jit.is_tracing() or not torch.is_grad_enabled()
        return {"scale": kwargs.get("scale", self.scale), "dropout": 0.0 if not self.training else 0.1, "child": self.child, "tracing": tracing}

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        cache: list[Any] = []
        for _ in range(4):
            batch, width = hidden.size(0), hidden.shape[-1]
            options = self._options(hidden, cache, use_cache=True, dtype=hidden.dtype, device=hidden.device)
            shape = (batch, -1, self.heads, width // self.heads)
            if isinstance(options["child"], nn.Module) and hidden.dim() > 0 and shape[2] > 0:
                output = _Output(hidden, tuple(cache), options)
        return output.hidden


def _op_tour(device: torch.device) -> list[Callable[[], object]]:
    """Tiny ops of as many kinds as a transformer's step runs (pointwise, views, reductions,
    products, a concatenation, an index, a cast, a softmax, a range): each takes its own path
    through the dispatcher to its own kernel, as a model's ops do."""
    a, b = torch.randn(1, 4, 16, device=device), torch.randn(1, 4, 16, device=device)
    weight, mask, index = torch.randn(16, 16, device=device), torch.ones(1, 4, 16, dtype=torch.bool, device=device), torch.tensor([0, 2], device=device)
    return [lambda: a + b, lambda: a * b, lambda: a.view(4, 16), lambda: a.transpose(1, 2), lambda: F.softmax(a, -1), lambda: a @ weight,
            lambda: torch.cat([a, b], -1), lambda: a[:, index], lambda: a.masked_fill(mask, 0.0), lambda: a.sum(-1),
            lambda: a.mean(-1, keepdim=True), lambda: torch.rsqrt(a.abs()), lambda: F.silu(a), lambda: a.to(torch.float16),
            lambda: a.unsqueeze(0), lambda: a.expand(2, 4, 16), lambda: torch.where(mask, a, b), lambda: a.pow(2),
            lambda: torch.arange(8, device=device), lambda: a.reshape(-1), lambda: F.linear(a, weight), lambda: a.neg(),
            lambda: a.clone(), lambda: a[..., :8], lambda: torch.stack([a, b]), lambda: a.max(-1)]


GLUE_EVERY = 6
"""Ops of the tour between two calls of :class:`_Glue` (its 799 instructions, some 130 an op;
Llama's decode step runs some 60 between two of its ops)."""

TOUR_CALLS = 100
"""Tours per timed loop (0.2 to 0.3 ms each on a 2-core EPYC)."""


def _per_bytecode(device: torch.device) -> float:
    """The host's time per bytecode instruction a model's own Python runs between its ops
    (:mod:`~jitflops.frontends.bytecode_count`): :class:`_Glue`'s call less a module call's, each
    between the ops of a tour of tiny ops of many kinds (:func:`_op_tour`), over the instructions
    it counts.

    Timed between ops, not in a loop of its own: a model's Python runs after ops that took their
    own paths through the dispatcher and their kernels, and has lost the core's caches and
    predictors to them. On a 2-core EPYC the glue ran at 23.6 to 24.1 ns an instruction in a loop
    and at 37 to 45 between the tour's ops (2026-12-07). Paired over 5 rounds, the decode steps of
    tiny decoders of 14 transformers families (``tools/decode_accuracy.py``) came 7 of 14 within 15%
    priced at the tour's rate, 3 of 14 at the loop's; in two more paired runs 10 against 5 and 4
    against 0, closer on 13, 13 and 14 of 14."""
    from ...frontends.bytecode_count import BytecodeCounter

    glue, identity, a = _Glue(), nn.Identity(), torch.ones(1, device=device)
    with BytecodeCounter() as counter:
        glue(a)
    if not counter.count:  # another trace function holds the trace (a debugger, a coverage run)
        return 0.0
    tour = _op_tour(device)

    def between(call: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            for index, op in enumerate(tour):
                op()
                if index % GLUE_EVERY == 0:
                    call()
        return run

    calls = len(range(0, len(tour), GLUE_EVERY))
    with_glue, with_identity = _per_call_interleaved(device, [between(lambda: glue(a)), between(lambda: identity(a))], calls=TOUR_CALLS)
    return max(0.0, (with_glue - with_identity) / calls / counter.count)


def host_seconds(device: torch.device) -> dict[str, float]:
    """Seconds per call of each kind (:data:`~jitflops.estimates.devices.HOST_KINDS`)."""
    a, b = torch.ones(1, device=device), torch.ones(1, device=device)
    identity = nn.Identity()
    op = _per_call(device, lambda: torch.add(a, b))
    return {"op": op, "view": _per_call(device, lambda: a.view(1)), "scalar": _per_call(device, lambda: a.size(0)),
            "module": _per_call(device, lambda: identity(a)), "backward": _backward_per_op(device), **_dtensor_per_op(device),
            "bytecode": _per_bytecode(device), **_fsdp_per_unit(device), **_library_calls(device), **per_fresh_page(device)}
