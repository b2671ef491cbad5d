"""The time of ``generate()``, predicted: the prefill over the prompt, then each decode step, on a device.

``generate`` runs the model once over the prompt (the prefill, which fills the KV cache) and once
per new token (a decode step: one token's work, its attention over every position cached before
it), each call with the positions of its tokens and, where the model takes it, ``logits_to_keep=1``
(the output layer for the last position alone: a sixth of GPT-2's prefill otherwise). The calls are
made as ``generate`` makes them. Nothing runs here: a meta copy of the model makes the cache a
decode step finds, by a forward over as many tokens as the cache then holds, and each call is
predicted as a forward is (:class:`~jitflops.estimates.roofline.PredictedTimeAnalysis`), from the
dispatch backend's recording: the path ``generate`` runs eagerly (transformers skips the causal mask
a trace materialises), and one a trace cannot take on meta tensors (the cache's tensors would
become the trace's constants). Only attention grows with the cache,
linearly: the decode steps are predicted at the first and the last position, and the steps between
them on the line through the two. At a small batch a decode step reads every weight for one token's
work: it is bound by memory (or by the host, in eager mode), which the op times carry; where the
weights and the cache fit a CPU's last-level cache, they are read from there
(:meth:`~jitflops.estimates.devices.DeviceSpec.for_decode`).

``generate`` works between the calls too: it processes each step's logits (a copy to float32, its
logits processors, the argmax), checks its stopping criteria, grows the ids and the attention mask
and makes the next call's inputs; 0.37 to 0.43 ms a token for a 2-layer Llama of width 256 on a
2-core EPYC, against decode steps of 1.2 to 1.9 ms, and 1.7 to 2.0 ms for GPT-2 (its 50,257
logits). That work is recorded by running ``generate`` itself, on real values, over the meta copy
whose calls return at once: logits of zeros and a cache one position longer, made where the
recording does not see them (:class:`_GenerateLoop`). Its ops and its Python are priced as a
forward's, for two and three new tokens: the setup once, each further token the difference.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from ..core.errors import TraceError
from ..core.model_io import ModelCall, generating_module, generation_cache, tensors_inside
from ..frontends.meta_values import DEVICE_META_KERNELS, empty_copy, holds_values, meta_kernels, reads_a_meta_value, valued_copy
from ..frontends.traced_path import on_the_traced_path
from .devices import DeviceSpec, device_spec
from .roofline import DeviceLike, PredictedTimeAnalysis


@dataclass(frozen=True)
class GenerationTime:
    """A ``generate()`` call's predicted seconds: the prefill, and its decode steps by position."""

    prefill_s: float
    first_decode_s: float
    last_decode_s: float
    decode_steps: int
    device: str
    mode: str
    own_s: Optional[float] = None
    """``generate``'s own work between the model's calls, in all (None: it could not be recorded)."""

    @property
    def decode_s(self) -> float:
        """The mean decode step (they grow linearly with the cache, from the first to the last)."""
        return (self.first_decode_s + self.last_decode_s) / 2 if self.decode_steps else 0.0

    @property
    def total_s(self) -> float:
        """The model's calls and ``generate``'s own work between them (where it was recorded)."""
        return self.prefill_s + self.decode_steps * self.decode_s + (self.own_s or 0.0)


def generate_call(model: nn.Module, ids: torch.Tensor, cached: int, cache: Any) -> dict[str, Any]:
    """The keyword arguments ``generate`` calls the model with for ``ids`` after ``cached`` positions."""
    takes = inspect.signature(model.forward).parameters
    call: dict[str, Any] = {"input_ids": ids, "use_cache": True}
    if cache is not None:
        call["cache" if "cache" in takes else "past_key_values"] = cache
    if "position_ids" in takes:
        call["position_ids"] = torch.arange(cached, cached + ids.shape[-1], device=ids.device).expand(ids.shape[0], -1)
    if "logits_to_keep" in takes:
        call["logits_to_keep"] = 1
    return call


def _cache_after(model: nn.Module, ids: torch.Tensor) -> Optional[Any]:
    """The KV cache a forward over ``ids`` leaves (on meta tensors, with the meta kernels that take
    what the devices' kernels do: a float32 mixture of experts' grouped product), on the path the
    model takes when traced, which reads no value meta tensors lack (MBart's decoder reads the mask
    it makes otherwise), as a count on meta runs it; None where the model keeps none."""
    with torch.no_grad(), meta_kernels(DEVICE_META_KERNELS), on_the_traced_path():
        cache = generation_cache(model(**generate_call(model, ids, 0, None)))
        made = _generates_cache(model) if cache is None else None
        if made is not None:
            model(**generate_call(model, ids, 0, made))
            cache = made if made.get_seq_length() else None
    return cache


def _generates_cache(model: nn.Module) -> Any:
    """The empty cache ``generate`` makes and passes to the prefill (a ``DynamicCache``), where a
    model makes none of its own: an encoder as a causal language model (BERT's, RoBERTa's and
    BigBird's without ``is_decoder``) fills it, and its decode steps take one token. None where
    ``generate`` makes none either."""
    supports = getattr(type(model), "_supports_default_dynamic_cache", None)
    if supports is None or not supports():
        return None
    from transformers import DynamicCache  # generate() is transformers': so is its cache

    return DynamicCache(config=model.config.get_text_config(decoder=True))


def decode_call(model: nn.Module, ids: torch.Tensor, cached: int) -> dict[str, Any]:
    """The keyword arguments of the decode step ``generate`` makes for the last of ``ids`` after
    ``cached`` positions, with the cache a forward over that many tokens leaves."""
    longer = torch.zeros(ids.shape[0], cached, dtype=ids.dtype, device=ids.device)
    cache = _cache_after(model, longer)
    whole = torch.cat([longer, ids[:, -1:]], dim=1)
    step = _step_ids(model, whole, cache)
    if cache is None:  # a model that keeps no cache (OpenAI GPT): generate runs it over every id again
        if step.shape[1] != whole.shape[1]:
            raise ValueError(f"{type(model).__name__} returned no cache with use_cache=True, nor filled one generate makes, and its steps "
                             "take fewer ids than generate holds (a state of its own): its decode steps cannot be predicted")
        return generate_call(model, whole, 0, None)
    return generate_call(model, step, cached + 1 - step.shape[1], cache)


@functools.lru_cache(maxsize=None)
def _prepares_by_next_length() -> bool:
    """Whether transformers' ``prepare_inputs_for_generation`` slices the ids by ``next_sequence_length``
    (transformers 5; before, by ``cache_position``, which a step made here does not pass)."""
    try:
        from transformers import GenerationMixin
    except ImportError:
        return False
    return "next_sequence_length" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters


def _step_ids(model: nn.Module, ids: torch.Tensor, cache: Any) -> torch.Tensor:
    """The ids a decode step over ``ids`` passes, as the model's ``prepare_inputs_for_generation``
    makes them: the last token, or all (CPM-Ant's forward slices the cached prefix off itself: over
    the last token alone it attended over none; OpenAI GPT keeps no cache). The last token where the
    model's preparation needs other inputs or makes other ids, or before transformers 5."""
    prepare = getattr(model, "prepare_inputs_for_generation", None)
    if prepare is None or not _prepares_by_next_length():
        return ids[:, -1:]
    try:
        step = prepare(ids, next_sequence_length=1, cache=cache, use_cache=True).get("input_ids")
    except Exception:  # a preparation that needs what a text prompt does not give (images, masks)
        step = None
    whole = isinstance(step, torch.Tensor) and step.dim() == 2 and step.shape[1] == ids.shape[1]  # not ids it adds to (XLM's mask token)
    return step if whole else ids[:, -1:]


def generation_seconds(model: nn.Module, ids: torch.Tensor, new_tokens: int, seconds: Callable[[dict[str, Any]], float]) -> tuple[float, float, float]:
    """The prefill's, the first decode step's and the last one's seconds, each call made as
    ``generate`` makes it on ``model`` (a meta copy) and priced by ``seconds`` of its keyword arguments."""
    prompt = ids.shape[1]

    def decode_at(cached: int) -> float:
        return seconds(decode_call(model, ids, cached))

    prefill = seconds(generate_call(model, ids, 0, None))
    steps = new_tokens - 1
    first = decode_at(prompt) if steps else 0.0
    last = decode_at(prompt + steps - 1) if steps > 1 else first
    return prefill, first, last


class _GenerateLoop(nn.Module):
    """``generate`` of ``new_tokens`` over ``model`` (a meta copy, held outside this module's
    parameters) whose every call returns at once: logits of zeros and its cache one position longer,
    made with the recording's modes off, so that what is recorded is ``generate``'s own work."""

    def __init__(self, model: nn.Module, new_tokens: int) -> None:
        super().__init__()
        self._generating = (model,)
        self.new_tokens = new_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        from transformers.modeling_outputs import CausalLMOutputWithPast  # generate() is transformers': so is its output

        (model,) = self._generating
        vocabulary = model.get_output_embeddings().weight.shape[0]
        # the output's field for the cache: ``cache`` in newer transformers (which warn at the old name)
        cache_field = "cache" if "cache" in {each.name for each in fields(CausalLMOutputWithPast)} else "past_key_values"

        @functools.wraps(model.forward)  # its signature, which generate reads to make the call's inputs
        def returns_at_once(input_ids: torch.Tensor, **kwargs: Any) -> Any:
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            with _disable_current_modes():
                batch, length = input_ids.shape
                if cache is not None:
                    cache.update(torch.zeros(batch, 1, length, 1), torch.zeros(batch, 1, length, 1), 0)
                logits = torch.zeros(batch, 1, vocabulary)
            return CausalLMOutputWithPast(logits=logits, **{cache_field: cache})

        model.forward = returns_at_once
        try:
            return model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=self.new_tokens,
                                  min_new_tokens=self.new_tokens, do_sample=False, pad_token_id=0)
        finally:
            del model.forward


def generate_own_seconds(model: nn.Module, ids: torch.Tensor, new_tokens: int, seconds: Callable[[nn.Module, torch.Tensor], float]) -> Optional[float]:
    """``generate``'s own work in making ``new_tokens`` from ``ids`` over ``model`` (a meta copy),
    priced by ``seconds`` of a module and its input, from its work for two new tokens and for three
    (None where ``generate`` does not run over calls that return at once)."""
    values = torch.zeros(ids.shape, dtype=ids.dtype)
    try:
        two, three = (seconds(_GenerateLoop(model, tokens), values) for tokens in (2, 3))
    except Exception:  # a model whose generate needs more of its outputs than logits and a cache
        return None
    return two + (new_tokens - 2) * (three - two)


def _predicted(module: nn.Module, args: tuple, kwargs: dict[str, Any], spec: DeviceSpec, mode: str) -> float:
    """``module``'s call on ``args`` and ``kwargs``, predicted from the dispatch backend's recording."""
    analysis = PredictedTimeAnalysis(module, args, kwargs, device=spec, mode=mode, backend="dispatch")
    return analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).total()


def predict_generation(model: nn.Module, input_ids: torch.Tensor, new_tokens: int, *, device: DeviceLike, mode: str = "eager") -> GenerationTime:
    """The predicted time of ``model.generate(input_ids, max_new_tokens=new_tokens)`` (greedy, with
    the KV cache, every token generated) on ``device``: one prefill, ``new_tokens - 1`` decode steps
    and ``generate``'s own work between them (in eager mode, whatever ``mode`` runs the model in)."""
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be at least 1, got {new_tokens}")
    spec = device_spec(device)
    model, call = generating_module(model), ModelCall((), {"input_ids": input_ids})
    try:
        twin, twin_call, _ = empty_copy(model, call)
        return _predicted_generation(twin, new_tokens, spec, mode, twin_call)
    except Exception as error:
        read = error.__cause__ if isinstance(error, TraceError) else error
        if not (reads_a_meta_value(read) and holds_values(model, call)):
            raise
    # a forward that reads a value (JetMoE's router: its experts' loads), of a model that has them: on a copy with its values
    twin, twin_call = valued_copy(model, call)
    return _predicted_generation(twin, new_tokens, spec, mode, twin_call)


def _predicted_generation(twin: nn.Module, new_tokens: int, spec: DeviceSpec, mode: str, call: ModelCall) -> GenerationTime:
    """:func:`predict_generation` on ``twin``, a copy of the model (of meta tensors, or with its values) and ``call``, its prompt's."""
    weight_bytes = sum(parameter.numel() * parameter.element_size() for parameter in twin.parameters())

    def seconds(inputs: dict[str, Any]) -> float:
        cache = generation_cache(inputs)
        if cache is None:  # the prefill
            return _predicted(twin, (), inputs, spec, mode)
        cached = {id(tensor.untyped_storage()): tensor.untyped_storage().nbytes() for tensor in tensors_inside(cache, depth=4)}
        return _predicted(twin, (), inputs, spec.for_decode(weight_bytes + sum(cached.values())), mode)

    prefill, first, last = generation_seconds(twin, call.kwargs["input_ids"], new_tokens, seconds)
    # generate's own loop runs eagerly whatever runs the model (its CUDA graphs, its compiled code)
    own = generate_own_seconds(twin, call.kwargs["input_ids"], new_tokens, lambda loop, ids: _predicted(loop, (ids,), {}, spec, "eager"))
    return GenerationTime(prefill, first, last, new_tokens - 1, spec.name, mode, own)
