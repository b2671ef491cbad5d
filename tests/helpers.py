"""Test helpers: wrap a function as a module, count it, and build fvcore-ready wrappers."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from jitflops import ActivationCountAnalysis, FlopCountAnalysis
from jitflops.model_io import tensor_leaves


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
