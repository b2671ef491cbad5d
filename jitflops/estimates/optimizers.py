"""The optimizers a memory estimate can step: names, classes, and 8-bit Adam's state layout.

An estimate runs the optimizer's own ``step`` on fake tensors, so its state is whatever the class
allocates (Adam's two moments in the parameter's dtype, Adafactor's factored rows and columns),
with the temporaries of its implementation (``foreach`` on a GPU, as torch's default is there).
8-bit Adam lives in bitsandbytes, which needs a GPU: :class:`Adam8bitLayout` allocates the state
bitsandbytes' ``Optimizer2State`` keeps (two uint8 moments and one float32 absolute maximum per
block of 256 elements; float32 moments for tensors under 4,096 elements) and does no arithmetic.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Union

import torch

from ..core.process_groups import is_dtensor

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
OptimizerChoice = Union[str, type, OptimizerFactory]

BLOCK_SIZE_8BIT = 256
MIN_8BIT_SIZE = 4096


class Adam8bitLayout(torch.optim.Optimizer):
    """The state of bitsandbytes' ``Adam8bit`` (blockwise), allocated on the first step; no update."""

    def __init__(self, params: Iterable[torch.nn.Parameter]) -> None:
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None or self.state[p]:
                    continue
                state = self.state[p]
                state["step"] = torch.zeros((), dtype=torch.float32)
                if p.numel() < MIN_8BIT_SIZE:
                    state["state1"] = torch.zeros_like(p, dtype=torch.float32)
                    state["state2"] = torch.zeros_like(p, dtype=torch.float32)
                    continue
                blocks = math.ceil(p.numel() / BLOCK_SIZE_8BIT)
                for moment in ("1", "2"):
                    state["state" + moment] = torch.zeros_like(p, dtype=torch.uint8)
                    state["absmax" + moment] = p.new_zeros((blocks,), dtype=torch.float32)


def _sgd_momentum(params: Iterable[torch.nn.Parameter], **kwargs: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01, momentum=0.9, **kwargs)


KNOWN_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": lambda params, **kwargs: torch.optim.SGD(params, lr=0.01, **kwargs),
    "sgd-momentum": _sgd_momentum,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "adafactor": torch.optim.Adafactor,
    "adam8bit": lambda params, **kwargs: Adam8bitLayout(params),
}
"""Names the API and the CLI take (``-`` and ``_`` alike, any case)."""

_TAKES_FOREACH = ("sgd", "sgd-momentum", "adam", "adamw", "adafactor")


def mixes_dtensors(params: Iterable[torch.Tensor]) -> bool:
    """Whether ``params`` mix DTensors and plain tensors, as a tensor-parallel model's do where its
    plan leaves the norms whole. DTensor refuses a multi-tensor (``foreach``) op over such a list,
    and torch's default on a GPU picks that implementation all the same: the first step raises
    ("got mixed torch.Tensor and DTensor"), and such a run steps with ``foreach=False``."""
    kinds = {is_dtensor(p) for p in params}
    return len(kinds) > 1


class UnknownOptimizerError(ValueError):
    """An optimizer name that is not in :data:`KNOWN_OPTIMIZERS`."""


def optimizer_factory(choice: OptimizerChoice, foreach: bool = False) -> OptimizerFactory:
    """A function of the parameters that builds the optimizer ``choice`` names: a name from
    :data:`KNOWN_OPTIMIZERS`, an ``Optimizer`` subclass (default arguments), or such a function.
    ``foreach``: torch's multi-tensor implementation (its default on a GPU), for the named ones."""
    if isinstance(choice, str):
        name = choice.strip().lower().replace("_", "-")
        name = {"adam-8bit": "adam8bit", "adamw8bit": "adam8bit", "adamw-8bit": "adam8bit", "momentum": "sgd-momentum"}.get(name, name)
        if name not in KNOWN_OPTIMIZERS:
            raise UnknownOptimizerError(f"unknown optimizer {choice!r}; known: {', '.join(KNOWN_OPTIMIZERS)} (or an Optimizer class, or a function of the parameters)")
        build = KNOWN_OPTIMIZERS[name]

        def named(params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
            params = list(params)
            return build(params, **({"foreach": foreach and not mixes_dtensors(params)} if name in _TAKES_FOREACH else {}))
        return named
    if isinstance(choice, type) and issubclass(choice, torch.optim.Optimizer):
        return lambda params: choice(params)
    if callable(choice):
        return choice
    raise UnknownOptimizerError(f"train must be an optimizer name ({', '.join(KNOWN_OPTIMIZERS)}), an Optimizer class or a function of the parameters, got {type(choice).__name__}")
