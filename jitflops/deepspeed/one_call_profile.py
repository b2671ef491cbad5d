"""DeepSpeed's ``get_model_profile``: one call profiled in eval mode (the model's modes restored
after), or a ``generate()`` call with ``mode="generate"``; DeepSpeed's numbers and strings."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Optional, Sequence

import torch
from torch import nn

from ..core.errors import JitflopsError, TraceError
from ..reports.deepspeed_report import format_model_profile
from ..profiling.ranks import is_writer
from ..reports.file_output import write_text
from ..profiling.generation import count_generation
from ..frontends.meta_values import built_on_meta
from .flops_profiler import FlopsProfiler
from ..reports.formatting import deepspeed_macs, deepspeed_number, deepspeed_params
from ..profiling.model_profile import ModelProfile
from ..profiling.profile import profile_model


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """``model.eval()`` for the duration, then each module's own training flag back."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _input_of_shape(model: nn.Module, input_shape: Sequence[int]) -> torch.Tensor:
    """DeepSpeed's ``input_shape`` input: random, in the model's floating dtype and on its device."""
    parameter = next((p for p in model.parameters() if p.is_floating_point()), None)
    if parameter is None:
        return torch.randn(*input_shape)
    return torch.randn(*input_shape, dtype=parameter.dtype, device=parameter.device)


def _failed_in_an_embedding(model: nn.Module, error: JitflopsError) -> bool:
    """Whether ``error`` (or the trace error it was raised from) names an embedding of ``model`` as the module that failed."""
    failed = next((each for each in (error, error.__cause__) if isinstance(each, TraceError)), None)
    return failed is not None and isinstance(dict(model.named_modules()).get(failed.scope), nn.Embedding)  # a lookup that cannot raise over the error


def get_model_profile(
    model: nn.Module,
    input_shape: Optional[Sequence[int]] = None,
    args: Sequence[Any] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    print_profile: bool = True,
    detailed: bool = True,
    module_depth: int = -1,
    top_modules: int = 1,
    warm_up: int = 1,
    as_string: bool = True,
    output_file: Optional[str] = None,
    ignore_modules: Optional[Sequence[type]] = None,
    mode: str = "forward",
    repeats: int = 5,
    peak_flops: Optional[float] = None,
) -> tuple[Any, Any, Any]:
    """DeepSpeed's ``get_model_profile``: ``(flops, macs, params)`` of one forward, in eval mode.

    ``input_shape`` makes a random input of that shape in the model's dtype and on its device (the
    only argument); otherwise ``args`` and ``kwargs`` are the call. ``mode="generate"`` profiles
    ``model.generate(*args, **kwargs)``: every forward it makes, each signature traced once. The
    forward is timed over ``repeats`` runs (median); DeepSpeed times one. Prints (or writes to
    ``output_file``) the profile unless ``print_profile`` is False.
    """
    if mode not in ("forward", "generate"):
        raise ValueError(f"mode must be 'forward' or 'generate', got {mode!r}")
    if input_shape is not None:
        if args or kwargs:
            raise ValueError("give either input_shape or args/kwargs, not both")
        args = (_input_of_shape(model, input_shape),)
    if not args and not kwargs:
        raise ValueError("give input_shape, or args and/or kwargs for the model's call")
    try:
        with evaluating(model):
            if mode == "forward":
                profile = profile_model(model, tuple(args), dict(kwargs or {}), warm_up=warm_up, repeats=repeats, ignore_modules=tuple(ignore_modules or ()), peak_flops=peak_flops)
            else:
                profile = _profile_generation(model, tuple(args), dict(kwargs or {}), warm_up, tuple(ignore_modules or ()), peak_flops)
    except JitflopsError as error:
        if input_shape is not None and _failed_in_an_embedding(model, error):
            error.add_note(f"input_shape made a random floating input of shape {tuple(input_shape)}, as DeepSpeed's does; a model that takes "
                           f"token ids takes them by args, e.g. args=[torch.randint(0, vocabulary, {tuple(input_shape)})]")
        raise
    if print_profile and is_writer():
        text = format_model_profile(profile, module_depth=module_depth, top_modules=top_modules, detailed=detailed)
        if output_file:
            write_text(output_file, text)
        else:
            print(text)
    flops, macs, params = profile.summary.flops, profile.summary.macs, profile.summary.params
    if as_string:
        return deepspeed_number(flops), deepspeed_macs(macs), deepspeed_params(params)
    return flops, macs, params


def _profile_generation(model: nn.Module, args: tuple, kwargs: dict, warm_up: int, ignore_modules: tuple[type, ...], peak_flops: Optional[float]) -> ModelProfile:
    generate = getattr(model, "generate", None)
    if not callable(generate):
        raise TypeError(f"mode='generate' needs a model with a generate() method; {type(model).__name__} has none")
    if built_on_meta(model):
        raise ValueError(f"mode='generate' times {type(model).__name__}.generate(), which needs the values a model on the meta device does not have: "
                         "count_generation(model, input_ids, max_new_tokens=...) counts its steps without running it")
    for _ in range(warm_up):
        generate(*args, **kwargs)
    profiler = FlopsProfiler(model, measure_backward=False, peak_flops=peak_flops)
    try:
        profiler.start_profile(ignore_modules)
        with torch.no_grad():
            generate(*args, **kwargs)
        profile = profiler.profile(step=warm_up)
    finally:
        profiler.end_profile()
    return dataclasses.replace(profile, generation=count_generation(model, *args, **kwargs))


__all__ = ["evaluating", "get_model_profile"]
