"""Serving a model on GPUs with tensor and pipeline parallelism: ``generate()``'s prefill and decode
steps, the memory per GPU with the KV cache grown to its length, and the largest batch that fits.

Each layout's numbers come from the model itself, sharded ``tp`` ways by its own tensor-parallel
plan on a fake process group, as :mod:`.stages` shards it for training:

- the prefill and the first and last decode steps are recorded as ``generate`` calls the model
  (:func:`~jitflops.estimates.generation_time.generate_call`: the prompt, then one token over the
  cache), their ops priced on the device's cost model and their all-reduces on the interconnect's
  tier inside a node (:mod:`.collective_time`); the steps between them grow linearly with the
  cache, as :func:`~jitflops.estimates.generation_time.predict_generation` takes them;
- memory is the memory estimate of the sharded model's prefill as ``generate`` calls it (the
  logits of the last position alone), at this batch (``memory_footprint(...,
  tensor_parallel=tp, kv_cache_length=prompt + new tokens)``): its weights' shard, the forward's
  peak and the KV cache grown to its length;
- inference memory grows linearly with the batch (the cache and the activations both do), so the
  estimates at 1 and 2 sequences give the largest batch that fits the device.

A decode step at a small batch reads every weight of its shard for one token's work: more tensor
parallelism splits those reads, and adds two all-reduces a block whose time is the ring's latency.

Pipeline parallelism (``pp`` stages of contiguous blocks, the embeddings on the first, the head on
the last) splits the memory, not the time of one batch: each call runs every stage in turn, and
each stage sends the next its hidden states (the call's tokens by the hidden size). A stage's
memory is the estimate's less what other stages hold: their blocks' parameters and their share of
the KV cache (the cache is the same for every block), and the embeddings or head it does not
hold; the forward's transient stays on every stage. One batch is in flight: a server that keeps a
batch per stage (vLLM's virtual engines) reaches up to ``pp`` times the tokens per second, at the
latency planned here.
"""

from __future__ import annotations

import functools
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
from torch import nn

from ..core.model_io import ModelCall
from ..engine.counting import module_aliases
from ..estimates.devices import DeviceSpec, device_spec
from ..estimates.error_bands import error_note
from ..estimates.fake_sharding import fake_process_group, shard_like_tensor_parallel
from ..estimates.generation_time import generate_call, generation_seconds
from ..estimates.memory_estimate import MemoryEstimate
from ..estimates.memory_footprint import memory_footprint
from ..estimates.roofline import WHOLE_CALLS, predicted_statistics
from ..frontends.dispatch_trace import record_with_dispatch
from ..frontends.meta_values import empty_copy
from ..handles import COMMUNICATION_FORMULAS, collective_of
from ..handles.collectives import Collective
from .collective_time import Placement, collective_seconds
from .interconnects import Interconnect, interconnect
from .layout import LayoutError
from .plan import check_heads_divide, hidden_state_bytes
from .stages import block_list, modules_before


@dataclass(frozen=True)
class ServingPlan:
    """``generate()`` of ``batch`` prompts of ``prompt`` tokens, ``new_tokens`` each, on ``tp x pp`` GPUs."""

    tp: int
    pp: int
    device: str
    interconnect: str
    """The link tensor parallelism's all-reduces cross ("none" on one GPU without one named)."""
    batch: int
    prompt: int
    new_tokens: int
    prefill_s: float
    first_decode_s: float
    last_decode_s: float
    memory_per_gpu_bytes: int
    """The peak with the KV cache grown to ``prompt + new_tokens`` (the largest stage's)."""
    kv_cache_per_token_bytes: int
    """One sequence's cache per token on one GPU (its shard of the key-value heads)."""
    memory_bytes: Optional[int]
    max_batch: Optional[int]
    """The most sequences whose cache and forward fit one GPU's memory (None: the device has no size)."""
    error: str

    @property
    def decode_s(self) -> float:
        """The mean decode step: one token for each of the batch's sequences."""
        return (self.first_decode_s + self.last_decode_s) / 2 if self.new_tokens > 1 else 0.0

    @property
    def total_s(self) -> float:
        return self.prefill_s + (self.new_tokens - 1) * self.decode_s

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of the whole ``generate()`` call, over its ``tp x pp`` GPUs."""
        return self.batch * self.new_tokens / self.total_s

    @property
    def fits(self) -> Optional[bool]:
        return None if self.memory_bytes is None else self.memory_per_gpu_bytes <= self.memory_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "pp": self.pp, "device": self.device, "interconnect": self.interconnect, "batch": self.batch, "prompt": self.prompt,
                "new_tokens": self.new_tokens, "prefill_s": self.prefill_s, "decode_s": self.decode_s, "first_decode_s": self.first_decode_s,
                "last_decode_s": self.last_decode_s, "total_s": self.total_s, "tokens_per_s": self.tokens_per_s,
                "memory_per_gpu_bytes": self.memory_per_gpu_bytes, "kv_cache_per_token_bytes": self.kv_cache_per_token_bytes,
                "memory_bytes": self.memory_bytes, "fits": self.fits, "max_batch": self.max_batch, "error": self.error}


def _call_seconds(twin: nn.Module, kwargs: dict[str, Any], spec: DeviceSpec, link: Optional[Interconnect], tp: int, pp: int, mode: str) -> float:
    """One recorded call's predicted seconds: its ops on ``spec``, its collectives on ``link`` inside a
    node, and the hidden states each of ``pp`` stages sends the next."""
    aliases = module_aliases(twin)
    with torch.no_grad():
        recording = record_with_dispatch(twin, ModelCall((), kwargs), aliases, guarded=False, whole=WHOLE_CALLS)
    kinds = COMMUNICATION_FORMULAS.kinds()
    compute = sum(predicted_statistics(recording, spec, mode, aliases, ignored=kinds).counts[""].values())
    if link is None:
        return compute
    group = Placement(tp, 1, link.gpus_per_node)
    sends = (pp - 1) * collective_seconds(Collective("send", 2, hidden_state_bytes(twin, kwargs["input_ids"].numel())), link, Placement(2, tp, link.gpus_per_node))
    return compute + sends + sum(collective_seconds(collective_of(record), link, group) for _, record in recording.records if record.kind in kinds)


def _stage_memory(model: nn.Module, estimate: MemoryEstimate, pp: int) -> int:
    """The largest stage's memory of ``pp``: the whole model's estimate less what the other stages hold."""
    if pp == 1:
        return estimate.needed()
    container, blocks = block_list(model)
    names = {module: name for name, module in model.named_modules()}
    container_name = names[container]
    block_bytes = [estimate.modules[names[block]].parameters for block in blocks]
    embeddings = sum(estimate.modules[name].parameters for name in modules_before(container_name, model) if name in estimate.modules)
    head = estimate.model.parameters - embeddings - sum(block_bytes)
    cache = estimate.kv_cache.bytes if estimate.kv_cache is not None else 0
    ranges = [(len(blocks) * stage // pp, len(blocks) * (stage + 1) // pp) for stage in range(pp)]

    def held_elsewhere(stage: int) -> float:
        first, last = ranges[stage]
        others = len(blocks) - (last - first)
        return (sum(block_bytes) - sum(block_bytes[first:last]) + cache * others / len(blocks)
                + (embeddings if stage else 0) + (head if stage < pp - 1 else 0))
    return int(estimate.needed() - min(held_elsewhere(stage) for stage in range(pp)))


def plan_serving(model: nn.Module, prompt: int, new_tokens: int, batch: int, device: Union[str, DeviceSpec], tp: int = 1,
                 interconnect_name: Union[str, Interconnect, None] = None, mode: str = "eager", pp: int = 1) -> ServingPlan:
    """The plan of serving ``model`` (built on the meta device: nothing is allocated) with ``tp``-way
    tensor parallelism and ``pp`` pipeline stages on ``device``: ``generate()`` of ``batch`` prompts
    of ``prompt`` tokens and ``new_tokens`` new ones each (greedy, with the KV cache)."""
    if min(prompt, new_tokens, batch, tp, pp) < 1:
        raise ValueError(f"prompt, new_tokens, batch, tp and pp must be at least 1, got {prompt}, {new_tokens}, {batch}, {tp}, {pp}")
    spec = device_spec(device)
    if isinstance(interconnect_name, Interconnect):
        link: Optional[Interconnect] = interconnect_name
    else:  # one GPU crosses no link: a device without a reference system serves on it
        link = interconnect(interconnect_name or spec.name) if tp * pp > 1 or interconnect_name else None
    check_heads_divide(model, tp)
    layers = len(block_list(model)[1])
    if pp > layers:
        raise LayoutError(f"{pp} stages are more than the model's {layers} blocks")
    if link is not None and tp > link.gpus_per_node:
        raise LayoutError(f"tp {tp} is more than a node's {link.gpus_per_node} GPUs on {link.name}")
    ids = torch.zeros(batch, prompt, dtype=torch.long, device="meta")
    twin, call, _ = empty_copy(model, ModelCall((), {"input_ids": ids}))
    ids = call.kwargs["input_ids"]
    with fake_process_group(tp) if tp > 1 else nullcontext() as mesh:
        if tp > 1:
            shard_like_tensor_parallel(twin, mesh)
        twin.eval()
        prefill, first, last = generation_seconds(twin, ids, new_tokens, lambda kwargs: _call_seconds(twin, kwargs, spec, link, tp, pp, mode))
    length = prompt + new_tokens
    sharding = {"tensor_parallel": tp} if tp > 1 else {}

    @functools.lru_cache(maxsize=None)
    def needed(sequences: int) -> tuple[int, int]:
        prompts = torch.zeros(sequences, prompt, dtype=torch.long, device="meta")
        estimate = memory_footprint(model, (), generate_call(model, prompts, 0, None), device=spec, kv_cache_length=length, **sharding)
        return _stage_memory(model, estimate, pp), estimate.kv_cache.bytes_per_token * -(-layers // pp) // layers
    at_batch, per_token = needed(batch)
    largest = None
    if spec.memory_bytes is not None:
        one, _ = needed(1)
        per_sequence = needed(2)[0] - one
        largest = max(0, (spec.memory_bytes - (one - per_sequence)) // per_sequence) if per_sequence > 0 else None
    return ServingPlan(tp, pp, spec.name, link.name if link is not None else "none", batch, prompt, new_tokens, prefill, first, last, at_batch, per_token, spec.memory_bytes, largest,
                       error_note(spec, "decode step"))
