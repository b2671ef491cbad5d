"""Every op in torch's own op database (``op_db``), a corpus jitflops was not written against.

For a few samples of each op (float32, CPU), each op wrapped in a module:

* no op is unsupported, under either backend;
* the JIT and dispatch backends give the same total;
* on the ops ``FlopCounterMode`` counts (products, convolutions, attention), the dispatch backend's
  count of those ops is ``FlopCounterMode``'s halved (it counts a multiply-add as two flops);
* an op's tensor arguments held as a module's buffers come back unchanged from a dispatch count,
  which copies values only where an op says it writes them (its schema, or the batch norm kernels
  of ``dispatch_trace.UNDECLARED_WRITES``);
* forward and backward (the samples with gradients, through every op that supports autograd): no
  backward op is unsupported, the ops ``FlopCounterMode`` counts are its count halved, and the
  total is never below it.

* where an op's samples export (``torch.export``, strict=False), the export backend's count is the
  dispatch backend's, with no unsupported op: a fixed draw of 80 ops, every op with
  ``JITFLOPS_OPDB_EXPORT=all`` (``docs/front-ends.md`` gives that run's figures).

``JITFLOPS_OPDB_SAMPLES`` sets the samples per op (default 2; ``tools/`` sweeps use more).
"""

from __future__ import annotations

import logging
import os
import random
import warnings
from typing import Iterator

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from jitflops import FlopCountAnalysis
from jitflops.core.errors import TraceError
from jitflops.core.model_guard import ModelChangedWarning

common_methods_invocations = pytest.importorskip("torch.testing._internal.common_methods_invocations")
from torch.testing._internal.common_utils import SEED, set_rng_seed  # noqa: E402

SAMPLES_PER_OP = int(os.environ.get("JITFLOPS_OPDB_SAMPLES", "2"))

TRACER_CANNOT_TRACE = {
    "fill": "an alias-analysis assert inside torch's tracer (aten::fill with a tensor value)",
    "resize_": "the tracer rejects an output whose data it cannot observe after an in-place resize",
    "resize_as_": "as resize_",
}
"""Ops whose samples torch's own JIT tracer fails on: what the op_db run allows the JIT to hand to its fallback,
the dispatch backend."""

KNOWN_BACKEND_DIFFERENCES = {
    ("norm", "nuc"): (
        "torch.norm is Python code whose body runs without any TorchFunctionMode, so the dispatch backend sees "
        "its SVD; and under any TorchDispatchMode torch's SVD also computes the singular vectors (its gradient "
        "check counts every tensor as a possible subclass), which a plain run does not: the dispatch backend "
        "counts that costlier SVD. The JIT counts the singular values alone, as a plain run computes them."
    ),
}
"""(op, variant) pairs whose two backends differ, and why: measured, not hidden."""

FLOP_COUNTER_KINDS = {str(op).replace(".", "::", 1) for op in flop_registry}


class OpModule(nn.Module):
    def __init__(self, op, kwargs):
        super().__init__()
        self.op = op
        self.kwargs = kwargs

    def forward(self, *args):
        return self.op(*args, **self.kwargs)


def _first_samples(info, requires_grad: bool) -> list:
    """The op's first ``SAMPLES_PER_OP`` float32 samples on the CPU, each seeded as
    ``info.sample_inputs`` seeds it, without that method's tracking wrapper: it walks the caller's
    stack with ``inspect`` to find the test running (0.1 s a call under pytest, most of the op
    database's time), and its generator was drained for two samples."""
    samples = iter(info.sample_inputs_func(info, "cpu", torch.float32, requires_grad))
    first = []
    for _ in range(SAMPLES_PER_OP):
        set_rng_seed(SEED)
        sample = next(samples, None)
        if sample is None:
            break
        first.append(sample)
    return first


def _samples(info):
    try:
        return _first_samples(info, requires_grad=False)
    except Exception:  # an OpInfo without float32 CPU samples
        return []


def _runs_eagerly(info, args, kwargs) -> bool:
    try:
        info.op(*args, **kwargs)
        return True
    except Exception:  # the sample is not valid for this op on the CPU (the op's own check): nothing to count
        return False


def _count(model, args, backend):
    analysis = FlopCountAnalysis(model, args, backend=backend).unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return analysis.total(), analysis.unsupported_ops(), analysis


OPS = common_methods_invocations.op_db


OP_IDS = [f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name for info in OPS]


@pytest.fixture(autouse=True)
def _log_errors_only():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def _runnable_samples(info) -> Iterator[tuple[tuple, dict]]:
    """The op's samples (positional and keyword arguments) that run eagerly."""
    for sample in _samples(info):
        args = (sample.input, *sample.args)
        if _runs_eagerly(info, args, sample.kwargs):
            yield args, sample.kwargs


@pytest.mark.parametrize("info", OPS, ids=OP_IDS)
def test_op_is_counted_alike_by_both_backends_and_torch(info):
    for args, kwargs in _runnable_samples(info):
        model = OpModule(info.op, kwargs)
        dispatch_total, dispatch_unsupported, dispatch = _count(model, args, "dispatch")
        jit_total, jit_unsupported, jit = _count(model, args, "jit")
        if jit.counted_by != "jit":  # the JIT's fallback counted it
            assert info.name in TRACER_CANNOT_TRACE, f"{info.name}: {jit.fallback_reason}"
            assert jit_total == dispatch_total
            continue
        assert not jit_unsupported and not dispatch_unsupported, (jit_unsupported, dispatch_unsupported)
        if (info.name, info.variant_test_name) not in KNOWN_BACKEND_DIFFERENCES:
            assert jit_total == dispatch_total, f"jit {jit_total} != dispatch {dispatch_total}"
        with FlopCounterMode(display=False) as torch_count:
            info.op(*args, **kwargs)
        ours = sum(op.count for op in dispatch.op_counts() if op.kind in FLOP_COUNTER_KINDS)
        assert 2 * ours == torch_count.get_total_flops()


class OpOnBuffers(nn.Module):
    """The op applied to the module's own buffers (the sample's tensor arguments), as a model's forward applies its
    parameters: what the op writes, the count must put back."""

    def __init__(self, op, args, kwargs):
        super().__init__()
        self.op, self.kwargs, self.args = op, kwargs, args
        for index, value in enumerate(args):
            if isinstance(value, torch.Tensor) and value.layout == torch.strided:
                self.register_buffer(f"arg{index}", value.clone())

    def forward(self):
        return self.op(*[self._buffers.get(f"arg{index}", value) for index, value in enumerate(self.args)], **self.kwargs)


def _unchanged(before: torch.Tensor, after: torch.Tensor) -> bool:
    return before.shape == after.shape and bool(((before == after) | (before != before) & (after != after)).all())


def _writes_its_buffers(info, args: tuple, kwargs: dict) -> bool:
    """Whether the op, run eagerly on a fresh :class:`OpOnBuffers`, changes a buffer (an op that
    raises there is counted all the same)."""
    model = OpOnBuffers(info.op, args, kwargs)
    before = {name: buffer.clone() for name, buffer in model.named_buffers()}
    try:
        model()
    except Exception:
        return True
    return any(not _unchanged(before[name], buffer) for name, buffer in model.named_buffers())


@pytest.mark.parametrize("info", OPS, ids=OP_IDS)
def test_what_an_op_writes_of_the_model_comes_back(info):
    """Each op's samples that write their arguments (``resize_``, ``squeeze_``, ...: found by running
    them eagerly; a sample that writes nothing leaves nothing to put back) are counted, and every
    buffer must come back as it was."""
    for args, kwargs in _runnable_samples(info):
        if not _writes_its_buffers(info, args, kwargs):
            continue
        model = OpOnBuffers(info.op, args, kwargs)
        before = {name: buffer.clone() for name, buffer in model.named_buffers()}
        with warnings.catch_warnings():
            warnings.simplefilter("error", ModelChangedWarning)
            FlopCountAnalysis(model, (), backend="dispatch").unsupported_ops_warnings(False).uncalled_modules_warnings(False).total()
        changed = [name for name, buffer in model.named_buffers() if not _unchanged(before[name], buffer)]
        assert not changed, f"{info.name} wrote {changed} and the count did not put them back"


AUTOGRAD_OPS = [info for info in OPS if info.supports_autograd]


def _float_outputs_with_grad(output) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]


def _samples_with_grad(info) -> Iterator[tuple[tuple, dict]]:
    """The op's samples with gradients that run eagerly and give a floating-point output to backpropagate from."""
    try:
        samples = _first_samples(info, requires_grad=True)
    except Exception:  # an OpInfo without float32 CPU samples
        return
    for sample in samples:
        args = (sample.input, *sample.args)
        try:
            if not _float_outputs_with_grad(info.op(*args, **sample.kwargs)):
                continue
        except Exception:  # not valid for this op on the CPU: nothing to count
            continue
        yield args, sample.kwargs


def _grouped_convolution(info, args: tuple, kwargs: dict) -> bool:
    """A convolution with ``groups`` > 1 (the seventh argument of the ``conv*`` functions, or a keyword)."""
    groups = kwargs.get("groups", args[6] if len(args) > 6 else 1)
    return "conv" in info.name and isinstance(groups, int) and groups > 1


@pytest.mark.parametrize("info", AUTOGRAD_OPS, ids=[f"{i.name}.{i.variant_test_name}" if i.variant_test_name else i.name for i in AUTOGRAD_OPS])
def test_every_backward_op_is_counted_and_never_below_torch(info):
    for args, kwargs in _samples_with_grad(info):
        analysis = FlopCountAnalysis(OpModule(info.op, kwargs), args, backend="dispatch", backward=True)
        analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        total, unsupported = analysis.total(), analysis.unsupported_ops()
        assert not unsupported, unsupported
        with FlopCounterMode(display=False) as torch_count:
            torch.stack([t.float().sum() for t in _float_outputs_with_grad(info.op(*args, **kwargs))]).sum().backward()
        if _grouped_convolution(info, args, kwargs):
            # FlopCounterMode charges a grouped convolution's weight gradient as an ungrouped one, groups times
            # its work: tests/test_dispatch.py checks the count against torch's own count of each group alone
            continue
        ours = sum(op.count for op in analysis.op_counts() if op.kind in FLOP_COUNTER_KINDS)
        assert 2 * ours == torch_count.get_total_flops()
        assert 2 * total >= torch_count.get_total_flops()


EXPORT_OPS = OPS if os.environ.get("JITFLOPS_OPDB_EXPORT") == "all" else random.Random(2026).sample(OPS, 80)


@pytest.mark.parametrize("info", EXPORT_OPS, ids=[f"{i.name}.{i.variant_test_name}" if i.variant_test_name else i.name for i in EXPORT_OPS])
def test_op_is_counted_by_export_as_by_dispatch_where_it_exports(info):
    exported_any = False
    for args, kwargs in _runnable_samples(info):
        model = OpModule(info.op, kwargs)
        try:
            export_total, export_unsupported, _ = _count(model, args, "export")
        except TraceError:  # this sample does not export (a value read in Python, an output export cannot take)
            continue
        exported_any = True
        dispatch_total, _, _ = _count(model, args, "dispatch")
        assert not export_unsupported, export_unsupported
        if (info.name, info.variant_test_name) not in KNOWN_BACKEND_DIFFERENCES:
            assert export_total == dispatch_total, f"export {export_total} != dispatch {dispatch_total}"
    if not exported_any:
        pytest.skip(f"{info.name}: no sample exports")
