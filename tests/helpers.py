"""Test helpers: wrap a function as a module, count it, build fvcore-ready wrappers, compare model
states, run the command line, run a function on several processes."""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import subprocess
from typing import Any, Callable

import torch
import torch.multiprocessing as mp
from torch import nn

from jitflops import ActivationCountAnalysis, FlopCountAnalysis
from jitflops.core.model_io import tensor_leaves


class Fn(nn.Module):
    """A module whose forward is ``fn``: lets tests trace plain tensor code."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def flops_of(fn: Callable[..., Any], *inputs: Any, **settings: Any) -> FlopCountAnalysis:
    return FlopCountAnalysis(Fn(fn), inputs, **settings).unsupported_ops_warnings(False)


def activations_of(fn: Callable[..., Any], *inputs: Any) -> ActivationCountAnalysis:
    return ActivationCountAnalysis(Fn(fn), inputs).unsupported_ops_warnings(False)


class FvcoreReady(nn.Module):
    """What fvcore needs around a model with keyword arguments or structured outputs:
    positional tensor arguments in, a tuple of tensors out."""

    def __init__(self, model: nn.Module, keyword_names: list[str]) -> None:
        super().__init__()
        self.model = model
        self.keyword_names = keyword_names

    def forward(self, *args: Any) -> tuple[torch.Tensor, ...]:
        if self.keyword_names:
            return tensor_leaves(self.model(**dict(zip(self.keyword_names, args))))
        return tensor_leaves(self.model(*args))


def _tensor_state(tensor: torch.Tensor) -> tuple:
    if isinstance(tensor, nn.parameter.UninitializedTensorMixin):
        return (id(tensor), type(tensor), None, tensor.requires_grad, None)
    grad = None if tensor.grad is None else tensor.grad.clone()
    return (id(tensor), type(tensor), tensor.detach().clone(), tensor.requires_grad, grad)


def model_state(model: nn.Module) -> dict:
    """Everything an analysis could disturb, for comparison before and after: classes, flags,
    attributes (lists, dicts and sets by content), hooks, children, parameters and buffers (objects,
    values, ``requires_grad`` and ``.grad``)."""
    return {
        name: (
            type(module),
            module.training,
            sorted(vars(module)),
            {k: repr(v) for k, v in vars(module).items() if type(v) in (list, dict, set)},
            list(module._modules.keys()),
            {k: len(getattr(module, k)) for k in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_forward_hooks_with_kwargs")},
            {k: _tensor_state(v) for k, v in module._parameters.items() if v is not None},
            {k: _tensor_state(v) for k, v in module._buffers.items() if v is not None},
        )
        for name, module in model.named_modules()
    }


def assert_same_state(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for name in before:
        *plain_before, params_before, buffers_before = before[name]
        *plain_after, params_after, buffers_after = after[name]
        assert plain_before == plain_after, name
        for old, new in ((params_before, params_after), (buffers_before, buffers_after)):
            assert old.keys() == new.keys()
            for key in old:
                (old_id, old_type, old_value, old_flag, old_grad), (new_id, new_type, new_value, new_flag, new_grad) = old[key], new[key]
                assert (old_id, old_type, old_flag) == (new_id, new_type, new_flag), f"{name}.{key}"
                assert _same(old_value, new_value) and _same(old_grad, new_grad), f"{name}.{key}"


def _same(a, b) -> bool:
    return a is b is None or (a is not None and b is not None and torch.equal(a, b))


def command_line(*args: str, expect: int = 0) -> subprocess.CompletedProcess:
    """The command line's ``main`` on ``args``, in this process (a new one would import torch again:
    3 to 4 s a call, a minute of the suite), its printouts captured, its exit code checked;
    ``python -m jitflops`` itself runs in ``tests/test_cli.py`` and in the docs' shell blocks."""
    from jitflops.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's refusals
            code = exit_.code if isinstance(exit_.code, int) else 2
    result = subprocess.CompletedProcess(["jitflops", *args], code, stdout.getvalue(), stderr.getvalue())
    assert result.returncode == expect, result.stderr
    return result


SERVER_MODULES = ["sharded_cases", "test_distributed", "test_memory", "jitflops.cli", "transformers", "transformers.models.starcoder2.modeling_starcoder2",
                  "transformers.models.llama.modeling_llama", "transformers.models.mixtral.modeling_mixtral"]
"""What the server the tests' processes are forked from imports once: the multi-process tests' rank
code, the command line, and the models they build."""


def _forkserver() -> Any:
    """multiprocessing's fork server (one per test process, started at its first use, in this
    process's environment then: the suite's, :mod:`conftest`), importing :data:`SERVER_MODULES`."""
    multiprocessing.set_forkserver_preload(SERVER_MODULES)
    return multiprocessing.get_context("forkserver")


def run_forked(function: Callable[..., None], *args: Any, timeout: float) -> int:
    """``function(*args)`` in a process forked from the fork server: its exit code (1 where it
    raised, its traceback on its standard error)."""
    process = _forkserver().Process(target=function, args=args)
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
        raise TimeoutError(f"{function.__name__} ran past {timeout} s")
    return process.exitcode


def run_on_ranks(function: Callable[..., None], world: int, *args: Any, fresh: bool = False) -> None:
    """``function(rank, *args)`` on ``world`` processes, joined, as ``torch.multiprocessing.spawn``
    runs it (a rank's exception raised here with its traceback), each process forked from the fork
    server. A fresh interpreter per rank spends 5 to 8 s of CPU importing torch and transformers: a
    2-rank pipeline case took 11 s spawned on a 2-core VM, 2.7 s forked. A forked process has the
    server's environment, from when it started: a test that sets a variable the ranks read at
    import passes ``fresh`` (spawned processes)."""
    if fresh:
        mp.spawn(function, args=args, nprocs=world, join=True)
        return
    _forkserver()  # its preload: torch's start_processes forks from the same server
    mp.start_processes(function, args=args, nprocs=world, join=True, start_method="forkserver")
