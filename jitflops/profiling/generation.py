"""Generation counted step by step: the prefill, then each decode step over a growing KV cache.

``model.generate()`` runs the model once over the prompt (the prefill) and then once per new token
(decode steps), each attending over every position before it: a decode step's attention grows
with the cache while its other work (projections, MLPs, the output layer) stays one token's.
:func:`count_generation` runs ``generate`` once and counts every forward it makes, in order, each
distinct call once (a step's count depends on its shapes and the cache's length only), so that
the whole, the prefill, each decode step, the MACs per generated token and the cache's share can
be read apart (DeepSpeed counts the whole only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable

import torch
from torch import nn

from ..engine.flop_count import FlopCountAnalysis
from ..estimates.generation_time import decode_call, generate_call
from ..frontends.meta_values import built_on_meta, empty_copy
from ..handles import short_op_name
from ..handles.attention import ATTENTION_KERNELS, SEQUENCE_FIRST_KERNELS
from ..core.model_io import ModelCall, generating_module, is_stateful, tensors_inside

_ATTENTION_KEYS = frozenset(short_op_name(kind) for kind in ("aten::scaled_dot_product_attention", *ATTENTION_KERNELS, *SEQUENCE_FIRST_KERNELS))


@dataclass(frozen=True)
class StepCount:
    """One forward of the generation: how many new tokens it took, over how many positions its
    attention looked (cache + new), its MACs and the part of them in attention kernels (SDPA, the
    flash and memory-efficient kernels): a model whose attention is plain products (``matmul``,
    ``einsum``: ProphetNet's n-gram attention, an ``attn_implementation="eager"``) has them among
    its products, and 0 here."""

    tokens: int
    positions: int
    macs: int
    attention_macs: int


@dataclass(frozen=True)
class GenerationCount:
    """Every forward of one ``generate()`` call, in order: the prefill first, then the decode steps."""

    steps: tuple[StepCount, ...]

    @property
    def prefill(self) -> StepCount:
        return self.steps[0]

    @property
    def decode(self) -> tuple[StepCount, ...]:
        return self.steps[1:]

    @property
    def macs(self) -> int:
        return sum(step.macs for step in self.steps)

    @property
    def decode_macs(self) -> int:
        return sum(step.macs for step in self.decode)

    @property
    def generated_tokens(self) -> int:
        """Tokens generated: one from the prefill's last position, one per decode step."""
        return len(self.steps)

    @property
    def macs_per_generated_token(self) -> float:
        """All MACs of the generation (the prefill included) per token generated."""
        return self.macs / self.generated_tokens

    @property
    def decode_macs_per_token(self) -> float:
        return self.decode_macs / len(self.decode) if self.decode else 0.0

    @property
    def kv_cache_share(self) -> float:
        """The share of the decode steps' MACs spent attending over the cache (the attention
        products of the ``generate`` decode steps: what grows with the context)."""
        return sum(step.attention_macs for step in self.decode) / self.decode_macs if self.decode_macs else 0.0


def _past_positions(call: ModelCall) -> int:
    """How many positions the call's generation cache holds already (0: none, or empty)."""
    for leaf in (*call.args, *call.kwargs.values()):
        if is_stateful(leaf):
            keys = [tensor for tensor in tensors_inside(leaf) if tensor.dim() >= 3]
            return int(keys[0].shape[-2]) if keys else 0
    return 0


def _new_tokens(call: ModelCall) -> int:
    ids = call.kwargs.get("input_ids", call.args[0] if call.args else None)
    if ids is None:
        ids = call.kwargs.get("inputs_embeds")
        return int(ids.shape[1]) if ids is not None else 0
    return int(ids.shape[-1])


def count_generation(model: nn.Module, *args: Any, **kwargs: Any) -> GenerationCount:
    """Run ``model.generate(*args, **kwargs)`` once (without gradients) and count each forward
    it makes (the JIT, or the dispatch backend where the JIT cannot trace the model).

    A model on the meta device has no values to generate with: it is not run, and its forwards are
    made as ``generate`` makes them (:func:`_calls_on_meta`). A ``torch.compile`` wrapper's
    ``generate`` runs the module it wraps, uncompiled: that module is counted."""
    model = generating_module(model)
    generate = getattr(model, "generate", None)
    if not callable(generate):
        raise TypeError(f"count_generation needs a model with a generate() method; {type(model).__name__} has none")
    calls = _calls_on_meta(model, args, kwargs) if built_on_meta(model) else _calls_of(model, generate, args, kwargs)
    counted: dict[Hashable, tuple[int, int]] = {}
    steps = []
    for call in calls:
        key = call.signature()
        if key not in counted:
            analysis = FlopCountAnalysis(model, call.args, call.kwargs).unsupported_ops_warnings(False).uncalled_modules_warnings(False)
            by_op = analysis.by_operator()
            counted[key] = (analysis.total(), sum(n for op, n in by_op.items() if op in _ATTENTION_KEYS))
        macs, attention = counted[key]
        tokens = _new_tokens(call)
        steps.append(StepCount(tokens, _past_positions(call) + tokens, macs, attention))
    return GenerationCount(tuple(steps))


def _calls_of(model: nn.Module, generate: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> list[ModelCall]:
    """The model's calls in one run of ``generate(*args, **kwargs)``, each with its cache as it found it."""
    calls: list[ModelCall] = []

    def capture(module: nn.Module, call_args: tuple, call_kwargs: dict) -> None:
        calls.append(ModelCall(tuple(call_args), dict(call_kwargs)).fresh())  # the cache as this step found it

    handle = model.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        with torch.no_grad():
            generate(*args, **kwargs)
    finally:
        handle.remove()
    return calls


_SHAPELESS_SETTINGS = frozenset({
    "input_ids", "inputs", "attention_mask", "max_new_tokens", "min_new_tokens", "max_length", "min_length", "do_sample",
    "temperature", "top_k", "top_p", "repetition_penalty", "pad_token_id", "eos_token_id", "use_cache", "generation_config",
})
"""``generate``'s arguments that leave its calls' shapes as greedy search makes them, every token
generated (the prompt and its all-ones mask, the length, sampling, the special tokens)."""


def _calls_on_meta(model: nn.Module, args: tuple, kwargs: dict[str, Any]) -> list[ModelCall]:
    """The calls ``generate(*args, **kwargs)`` makes, on the meta device: the prefill over the
    prompt, then a decode step for each further new token over the cache the steps before leave
    (every token generated: no value says where an end-of-sequence token would stop it)."""
    others = sorted(set(kwargs) - _SHAPELESS_SETTINGS)
    if len(args) > 1 or others or kwargs.get("use_cache") is False:
        named = others or (["use_cache=False"] if kwargs.get("use_cache") is False else ["positional arguments after the prompt"])
        raise ValueError(f"count_generation of {type(model).__name__}, on the meta device, makes its calls as greedy search makes them with the "
                         f"KV cache, from input_ids and the length; it cannot take {', '.join(named)}: count a model built on the CPU")
    ids = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs"))
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ValueError(f"count_generation of {type(model).__name__}, on the meta device, needs the prompt's input_ids (batch, length)")
    prompt = ids.shape[1]
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    limit = kwargs.get("max_new_tokens") or getattr(config, "max_new_tokens", None)
    new_tokens = limit if limit is not None else (kwargs.get("max_length") or getattr(config, "max_length", 20)) - prompt
    if new_tokens < 1:
        raise ValueError(f"count_generation: no token to generate from a prompt of {prompt} (max_new_tokens or max_length)")
    ids = ids.to("meta")
    twin, _, _ = empty_copy(model, ModelCall((), {}))  # all on meta, without accelerate's hooks: where each decode step's cache is made
    decode = [ModelCall((), decode_call(twin, ids, cached)) for cached in range(prompt, prompt + new_tokens - 1)]
    return [ModelCall((), generate_call(model, ids, 0, None)), *decode]
