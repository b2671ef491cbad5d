"""Count every base-model architecture of transformers' auto mapping, built from a tiny config.

Each architecture is built from its config class with generic shrinking (few layers, small hidden
sizes, few heads and experts) and random weights, given inputs made from its ``main_input_name``,
and run eagerly. Where the forward runs, it is counted by both backends and by ``FlopCounterMode``,
then by the dispatch backend in training mode with its backward; a decoder (an architecture with a
causal-LM head, given ids) is also counted mask-aware by both backends, without padding and
left-padded; and the architecture built on the meta device, as a model too large to hold is built, is
counted on the same inputs on meta and on the CPU (as users make them). The sweep reports per
architecture: errors, unsupported ops, JIT != dispatch (either convention), totals below
``FlopCounterMode``'s (halved: it counts a multiply-add as two flops), the counts on meta, and any
parameter or buffer the counts did not give back as it was (values, ``requires_grad``, ``.grad``).

    python tools/sweep.py                       # every architecture, results in tools/sweep_results.json
    python tools/sweep.py --only bert,llama     # some
    python tools/sweep.py --sample 12 --seed 0  # a random sample (what the test suite runs)
    python tools/sweep.py --decoders --output tools/sweep_decoders.json  # the decoders alone

Architectures run in worker processes, each with a time limit, so one that hangs or crashes does
not stop the sweep.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import multiprocessing
import random
import re
import signal
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

RESULTS = Path(__file__).with_name("sweep_results.json")

DEPTH = {
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "encoder_layers": 2, "decoder_layers": 2,
    "num_decoder_layers": 2, "num_encoder_layers": 2,
}
"""Depth alone: the second recipe, for architectures whose widths are tied together in ways generic
shrinking breaks (fixed head dims, rope sections, hybrid layer patterns)."""

SHRINK = {
    **DEPTH,
    # sizes
    "hidden_size": 64, "d_model": 64, "n_embd": 64, "embed_dim": 64, "dim": 64, "projection_dim": 32, "out_hidden_size": 64,
    "intermediate_size": 128, "ffn_dim": 128, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "d_ff": 128, "n_inner": 128,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
    # heads
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "num_heads": 4, "num_key_value_heads": 2,
    # experts
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
}
"""Config keys shrunk wherever they hold an integer, at every level of nested configs: the first recipe."""

NARROW = {
    **DEPTH,
    "vocab_size": 512, "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    "intermediate_size": 1024, "moe_intermediate_size": 256, "shared_expert_intermediate_size": 512, "image_size": 224,
}
"""Depth, vocabulary, experts and feed-forward widths alone: the third recipe, for large-vocabulary and many-expert models whose
widths generic shrinking breaks (DeepSeek-V3.2's sparse attention, Mistral-Large-4, HY-V4); the special token
ids that no longer fit the vocabulary are moved into it."""

RECIPES = {"tiny": SHRINK, "shallow": DEPTH, "narrow": NARROW}
KEYS_FOR_EVERY_HEAD = ("glm4_moe_lite", "mistral4", "nemotron3_5_transcribe_asr_audio", "nemotron3_diarization_audio")
"""Architectures whose configs ship as many key-value heads as query heads and whose attention
assumes it: keys or values come out with every query head whatever ``num_key_value_heads`` says
(GLM-4-MoE-Lite's and Mistral 4's MLA up-projection, the Nemotron audio encoders' value
projection), while ``num_key_value_groups`` follows the config. Shrunk to fewer key-value heads,
the model contradicts itself: eager SDPA's ``enable_gqa`` accepts the heads it is given, and the
path transformers takes under ``torch.export`` repeats them into twice the query heads, which
``torch.export`` rejects. They keep as many key-value heads as heads, as their configs do."""
MAX_PARAMETERS = 1_000_000_000
"""A recipe that leaves more parameters than this is not built (measured on the meta device)."""

KNOWN_DIFFERENCES = {
    **dict.fromkeys(
        ("clipseg", "dinov2", "dinov2_with_registers", "internvl", "internvl_vision", "pixio", "qianfan_ocr", "qianfan_ocr_vision", "tipsv2",
         "tipsv2_vision_model", "vitdet"),
        "the model's code takes a torch.jit.is_tracing() branch (an extra bicubic interpolation of the position "
        "embeddings) that runs only under the JIT tracer",
    ),
    "vits": "stochastic durations: every forward produces another output length, so each count differs",
    **dict.fromkeys(
        ("d_fine", "deimv2", "pp_doclayout_v3", "pp_doclayout_v4", "rt_detr", "rt_detr_v2"),
        "the model caches its sine position embeddings between calls (an LRU cache keyed by the grid size, "
        "which the JIT tracer's tensor sizes miss): an eager forward after the first finds them cached, the trace "
        "computes them (an outer product, 12,800 MACs here)",
    ),
}
"""Architectures whose own code makes the counts differ between runs or front ends."""

SEQUENCE = 8
PADDING = 3
"""A decoder's mask-aware count is also taken with its ids left-padded by this many positions."""
TIME_LIMIT_S = 300
"""Per architecture, every count included, on a 2-core machine with the other worker running: the
slowest that finish are LightOnOCR (285 s) and Mimi (167 s, most of it its ``draft_export``);
V-JEPA 2's training-mode count, last, runs past it."""


@dataclass
class ArchitectureResult:
    model_type: str
    class_name: str
    recipe: str = ""
    status: str = "ok"
    """ok | build failed | eager failed | counted (with faults listed) | timeout"""
    error: str = ""
    jit_error: str = ""
    dispatch_error: str = ""
    training_error: str = ""
    """The dispatch backend's count in training mode, with the backward pass."""
    jit: Optional[int] = None
    """The default call's count (the JIT, or its fallback: ``counted_by``)."""
    counted_by: str = ""
    fallback_reason: str = ""
    jit_from_calls: bool = False
    """Whether the default count was read from the model's calls, without the tracer
    (:mod:`jitflops.frontends.call_recording`)."""
    calls_modules_differ: list = field(default_factory=list)
    """Where it was: the modules whose count is not the JIT trace's (empty: every module agrees)."""
    dispatch: Optional[int] = None
    export: Optional[int] = None
    """The export backend's count (``torch.export``, strict=False, read statically)."""
    export_error: str = ""
    export_modules_differ: list = field(default_factory=list)
    """Modules whose export count is not the dispatch backend's (empty: every module agrees)."""
    export_unsupported: dict = field(default_factory=dict)
    flop_counter: Optional[float] = None
    masked: dict = field(default_factory=dict)
    """A decoder's mask-aware counts: ``jit`` and ``dispatch``, unpadded and ``padded`` (empty: not a decoder)."""
    padded_error: str = ""
    """Why a decoder's padded forward was not counted: its eager forward fails on a padding mask."""
    meta: dict = field(default_factory=dict)
    """The default count of the architecture built on the meta device, by where its inputs are:
    ``meta``, ``cpu``; an error's text where it failed."""
    meta_counted_by: str = ""
    unsupported: dict = field(default_factory=dict)
    changed: list = field(default_factory=list)
    """Parameters and buffers that did not come back from the counts as they were."""
    seconds: float = 0.0

    @property
    def known_difference(self) -> str:
        """Why this architecture's backends may differ, where its own code makes them."""
        return KNOWN_DIFFERENCES.get(self.model_type, "")

    @property
    def clean(self) -> bool:
        return (
            self.jit is not None and self.dispatch is not None and self.jit == self.dispatch and not self.unsupported
            and (self.flop_counter is None or 2 * self.jit >= self.flop_counter) and not self.changed and self.masked_agree
            and not self.calls_modules_differ
        )

    @property
    def meta_reads_a_value(self) -> bool:
        """Whether the count on meta failed where the forward reads a value (``.item()``), which no
        meta tensor has: not a fault of the count."""
        from jitflops.frontends.meta_values import META_VALUE_READS

        return any(isinstance(count, str) and any(words in count for words in META_VALUE_READS) for count in self.meta.values())

    @property
    def meta_agrees(self) -> bool:
        """Whether the counts on meta are the CPU's: the JIT's, or the dispatch backend's where the
        count on meta fell back to it."""
        expected = self.dispatch if self.meta_counted_by == "dispatch" else self.jit
        return bool(self.meta) and all(count == expected for count in self.meta.values())

    @property
    def masked_agree(self) -> bool:
        """Whether both backends' mask-aware counts of a decoder are equal, unpadded and padded."""
        return all(self.masked.get(f"jit{padded}") == self.masked.get(f"dispatch{padded}") for padded in ("", " padded"))


def _nested(config: Any, name: str) -> Any:
    """``config.name``, or the first nested config's (an audio model's ``encoder_config``)."""
    value = getattr(config, name, None)
    if value is not None:
        return value
    for nested in vars(config).values():
        if hasattr(nested, "to_dict") and hasattr(nested, "model_type"):
            value = _nested(nested, name)
            if value is not None:
                return value
    return None


_MULTIMODAL_ROPE_TEXT = re.compile(r"^(glm4v|glm46v|glm_image|qwen2_5_vl|qwen2_vl|qwen3_vl)\w*_text$")


def _fit_vocabulary(config: Any) -> None:
    """A multimodal model's special token ids (its image token's) inside its text vocabulary: a
    checkpoint grows the vocabulary by its added tokens, the config class's default may not."""
    text = getattr(config, "text_config", None) or config
    vocabulary = getattr(text, "vocab_size", None)
    ids = [value for key, value in vars(config).items() if key.endswith(("_token_id", "_token_index")) and isinstance(value, int) and not isinstance(value, bool)]
    if isinstance(vocabulary, int) and ids and max(ids) >= vocabulary:
        text.vocab_size = max(ids) + 1


def _fit_multimodal_rope(config: Any) -> None:
    """Qwen-VL's and GLM-V's multimodal rotary embedding splits each head's rotary half into
    sections (time, height, width) whose sizes the model defaults to for its own head size: they are
    set to about the same 2:3:3 split of the shrunk head's rotary half (its partial rotary factor's)."""
    vision = getattr(config, "vision_config", None)
    if getattr(vision, "spatial_merge_size", None):
        text = getattr(config, "text_config", None)
    else:  # a text tower of such a model, built alone (GLM-4V's)
        text = config if _MULTIMODAL_ROPE_TEXT.search(getattr(config, "model_type", "")) else None
    if text is None or not isinstance(getattr(text, "rope_parameters", None), dict):
        return
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    partial = getattr(text, "partial_rotary_factor", None) or text.rope_parameters.get("partial_rotary_factor", 1.0)
    half = int(head * partial) // 2
    text.rope_parameters = {**text.rope_parameters, "mrope_section": [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]}


def _shrink(config: Any, sizes: dict[str, int]) -> None:
    for key, value in list(vars(config).items()):
        if key in sizes and isinstance(value, int) and not isinstance(value, bool) and value > sizes[key]:
            setattr(config, key, sizes[key])
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):
            _shrink(value, sizes)
    vocabulary = getattr(config, "vocab_size", None)
    if "vocab_size" in sizes and isinstance(vocabulary, int):
        too_large = sorted(key for key, value in vars(config).items() if key.endswith(("_token_id", "_token_index")) and isinstance(value, int) and value >= vocabulary)
        for offset, key in enumerate(too_large, 1):  # distinct ids at the top of the vocabulary
            setattr(config, key, vocabulary - offset)
    if "head_dim" in vars(config) and config.head_dim is None and isinstance(getattr(config, "num_attention_heads", None), int):
        config.head_dim = config.hidden_size // config.num_attention_heads  # the default a model reads as given (HunYuan's)
    if getattr(config, "model_type", None) == "timm_backbone" and getattr(config, "backbone", None) is None:
        config.backbone, config.use_pretrained_backbone = "resnet18", False  # its config names no timm model: a small one, random weights
    if getattr(config, "model_type", None) in KEYS_FOR_EVERY_HEAD:
        config.num_key_value_heads = config.num_attention_heads
    _fit_multimodal_rope(config)
    _fit_vocabulary(config)
    layers = getattr(config, "num_hidden_layers", None)
    for key in ("layer_types", "mlp_only_layers"):
        value = getattr(config, key, None)
        if isinstance(value, list) and isinstance(layers, int) and key == "layer_types":
            setattr(config, key, value[:layers])


_IMAGE_TOKENS = re.compile(r"Image features and image tokens do not match,? tokens: (\d+), features:? (\d+)")


def _image_tokens_wanted(error: Exception) -> Optional[int]:
    """How many image tokens a multimodal model wanted in its ids, from transformers' own message."""
    found = _IMAGE_TOKENS.search(str(error))
    return int(found.group(2)) if found else None


_PATCHES = re.compile(r"split_with_sizes expects split_sizes to sum exactly to 1 .*but got split_sizes=\[(\d+)\]")


def _patches_wanted(error: Exception) -> Optional[int]:
    """How many patches of its one image an any-resolution model (LLaVA-NeXT's) split it into, from
    the split that failed on a single patch."""
    found = _PATCHES.search(str(error))
    return int(found.group(1)) if found else None


def _image_token_id(config: Any) -> Optional[int]:
    for key in ("image_token_id", "image_token_index"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return None


def _inputs(model: Any, config: Any, image_tokens: int = 0) -> dict[str, Any]:
    """Inputs for the model's ``main_input_name``; encoder-decoder models also get decoder ids, and
    models with a vision tower also get pixels (and ``image_tokens`` image tokens in their ids, with
    the image's size where the model asks for it)."""
    import torch

    name = getattr(model, "main_input_name", "input_ids")
    vision = getattr(config, "vision_config", None)
    inputs: dict[str, Any] = {}
    if name == "input_ids":
        vocab = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", 100)
        ids = torch.randint(0, min(vocab, 100), (1, SEQUENCE + image_tokens))
        image_token = _image_token_id(config)
        ids[ids == image_token] = 0
        if image_tokens and image_token is not None:
            ids[0, 1:1 + image_tokens] = image_token
        inputs["input_ids"] = ids
    if name == "pixel_values" or (name == "input_ids" and vision is not None):
        vision = vision or config
        size = getattr(vision, "image_size", 32)
        size = size[0] if isinstance(size, (list, tuple)) else size
        inputs["pixel_values"] = torch.randn(1, getattr(vision, "num_channels", 3), size, size)
        if "image_sizes" in inspect.signature(model.forward).parameters:
            inputs["image_sizes"] = torch.tensor([[size, size]])
    if name == "pixel_values_videos":  # a video: frames of the model's image size
        size = getattr(config, "crop_size", None) or getattr(config, "image_size", 32)
        size = size[0] if isinstance(size, (list, tuple)) else size
        frames = getattr(config, "frames_per_clip", None) or getattr(config, "num_frames", None) or 8
        inputs["pixel_values_videos"] = torch.randn(1, frames, getattr(config, "num_channels", 3), size, size)
    if name == "past_values":  # a time series: the context window of every input channel
        inputs["past_values"] = torch.randn(1, config.context_length, getattr(config, "num_input_channels", 1))
    if name == "input_values":
        inputs["input_values"] = torch.randn(1, 4000)
    if name == "input_features":
        frames = 3000 if "whisper" in type(config).__name__.lower() else 64
        inputs["input_features"] = torch.randn(1, _nested(config, "num_mel_bins") or 80, frames)
    if not inputs:
        raise ValueError(f"no input recipe for main input {name!r}")
    if getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = torch.randint(0, 2, (1, SEQUENCE))
    return inputs


def _flattened_patches(vision: Any) -> tuple[Any, Any, int]:
    """A Qwen-VL-style image for ``vision`` (its vision config): one frame of 2 x 2 merged patches,
    flattened as its processor flattens them, the grid (``[[1, height, width]]`` in patches), and how
    many image tokens the merged patches make."""
    import torch

    merge = getattr(vision, "spatial_merge_size", None) or 2
    side, patch = 2 * merge, getattr(vision, "patch_size", 14)
    channels = getattr(vision, "in_channels", None) or getattr(vision, "num_channels", 3)
    patches = torch.randn(side * side, channels * (getattr(vision, "temporal_patch_size", None) or 1) * patch * patch)
    return patches, torch.tensor([[1, side, side]]), side * side // (merge * merge)


def _input_variants(model: Any, config: Any, inputs: dict[str, Any]) -> list[dict[str, Any]]:
    """Other inputs to try where the first ones fail, each a modality's other layout: no cache
    (hybrid models whose cache has no attention layer to measure), a larger image (detectors),
    video frames (``(1, frames, channels, height, width)``), audio features time-major and raw audio
    with a channel dimension, and Qwen-VL's flattened patches with their grid: for its vision tower
    alone (``grid_thw``), and for the whole model (``image_grid_thw``, as many image tokens as merged
    patches, and which ids they are where the model asks)."""
    import torch

    parameters = inspect.signature(model.forward).parameters
    no_cache = {"use_cache": False} if "use_cache" in parameters else {}
    inputs = {**inputs, **no_cache}
    variants = [inputs] if no_cache else []
    pixels = inputs.get("pixel_values")
    if pixels is not None and pixels.dim() == 4 and pixels.shape[-1] < 320:  # detectors rank more anchors than a small image has
        variants.append({**inputs, "pixel_values": torch.randn(*pixels.shape[:2], 320, 320)})
    if pixels is not None and pixels.dim() == 4:
        frames = getattr(config, "num_frames", None) or getattr(getattr(config, "vision_config", None), "num_frames", None) or 1
        variants.append({**inputs, "pixel_values": pixels.unsqueeze(1).expand(-1, frames, -1, -1, -1).contiguous()})
    features = inputs.get("input_features")
    if features is not None:
        variants.append({**inputs, "input_features": features.transpose(1, 2).contiguous()})
    values = inputs.get("input_values")
    if values is not None and values.dim() == 2:
        variants.append({**inputs, "input_values": values.unsqueeze(1).expand(-1, getattr(config, "audio_channels", 1) or 1, -1).contiguous()})
    if "grid_thw" in parameters:  # a Qwen-VL-style vision tower alone
        patches, grid, _ = _flattened_patches(config)
        name = next(name for name in parameters if name not in ("self", "grid_thw"))
        variants.append({name: patches, "grid_thw": grid})
    vision = getattr(config, "vision_config", None)
    if pixels is not None and getattr(vision, "spatial_merge_size", None) and getattr(vision, "temporal_patch_size", None) and "image_grid_thw" in parameters:
        patches, grid, tokens = _flattened_patches(vision)
        grid = {**_inputs(model, config, tokens), **no_cache, "pixel_values": patches, "image_grid_thw": grid}
        if "mm_token_type_ids" in parameters:  # which ids are image tokens, as the processor says (M-RoPE)
            grid["mm_token_type_ids"] = (grid["input_ids"] == _image_token_id(config)).long()
        variants.append(grid)
    return variants


def _tensor_states(model: Any) -> dict[str, tuple]:
    """Each parameter's and buffer's values, ``requires_grad`` and ``.grad``, copied."""
    tensors = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    return {name: (tensor.detach().clone(), tensor.requires_grad, None if tensor.grad is None else tensor.grad.clone()) for name, tensor in tensors}


def _same_values(before: Any, after: Any) -> bool:
    if before is None or after is None:
        return before is after
    return before.shape == after.shape and bool(((before == after) | (before != before) & (after != after)).all())


def _changed(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    return sorted(
        name for name in before.keys() | after.keys()
        if name not in before or name not in after or not _same_values(before[name][0], after[name][0])
        or before[name][1] != after[name][1] or not _same_values(before[name][2], after[name][2])
    )


def run_architecture(model_type: str, class_name: str) -> ArchitectureResult:
    """Build, run and count one architecture, with warnings and log messages below errors muted."""
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _build_run_and_count(model_type, class_name)
    finally:
        logging.disable(logging.NOTSET)


def _build_run_and_count(model_type: str, class_name: str) -> ArchitectureResult:
    import torch
    import transformers

    import jitflops

    start = time.perf_counter()
    for recipe, sizes in RECIPES.items():  # the first recipe whose model builds and runs
        result = ArchitectureResult(model_type, class_name, recipe)
        try:
            config = transformers.AutoConfig.for_model(model_type)
            _shrink(config, sizes)
            model_class = getattr(transformers, class_name)
            with torch.device("meta"):
                parameters = sum(p.numel() for p in model_class(config).parameters())
            if parameters > MAX_PARAMETERS:
                raise ValueError(f"{parameters / 1e6:.0f}M parameters after shrinking")
            torch.manual_seed(0)
            model = model_class(config).eval()
            inputs = _inputs(model, config)
        except Exception as error:
            result.status, result.error = "build failed", f"{type(error).__name__}: {str(error)[:300]}"
            continue
        try:
            result.flop_counter, inputs = _first_that_runs(model, config, inputs)
            break
        except Exception as error:
            result.status, result.error = "eager failed", f"{type(error).__name__}: {str(error)[:300]}"
    if result.status != "ok":
        return result
    unsupported: Counter = Counter()
    before = _tensor_states(model)
    per_module: dict[str, Counter] = {}
    for backend in ("jit", "dispatch", "export"):
        try:
            analysis = jitflops.FlopCountAnalysis(model, inputs, backend=backend)
            setattr(result, backend, int(analysis.total()))
            per_module[backend] = +analysis.by_module(emit_warnings=False)
            if backend == "export":
                result.export_unsupported = dict(analysis.unsupported_ops())
                result.export_modules_differ = sorted(name for name in set(per_module["export"]) | set(per_module.get("dispatch", {}))
                                                      if per_module["export"][name] != per_module.get("dispatch", Counter())[name])
                continue
            if backend == "jit":
                result.jit_from_calls = analysis._trace is None  # before counted_by, which traces
                if result.jit_from_calls:
                    traced = +jitflops.FlopCountAnalysis(model, inputs, compute=True).by_module(emit_warnings=False)
                    result.calls_modules_differ = sorted(name for name in set(traced) | set(per_module["jit"]) if traced[name] != per_module["jit"][name])
                result.counted_by, result.fallback_reason = analysis.counted_by, analysis.fallback_reason or ""
            unsupported.update({f"{backend}:{op}": n for op, n in analysis.unsupported_ops().items()})
        except Exception as error:
            setattr(result, f"{backend}_error", f"{type(error).__name__}: {str(error)[:300]}")
    result.meta, result.meta_counted_by = _counts_on_meta(getattr(transformers, class_name), config, inputs)
    if model_type in decoder_types() and "input_ids" in inputs and "attention_mask" in inspect.signature(model.forward).parameters:
        padding = torch.ones_like(inputs["input_ids"])
        padding[:, :PADDING] = 0
        try:
            with torch.no_grad():
                model(**{**inputs, "attention_mask": padding})
            variants = (("", {}), (" padded", {"attention_mask": padding}))
        except Exception as error:  # the model's own forward does not take this padding: nothing to count
            result.padded_error = f"{type(error).__name__}: {str(error)[:300]}"
            variants = (("", {}),)
        for padded, extra in variants:
            for backend in ("jit", "dispatch"):
                try:
                    result.masked[f"{backend}{padded}"] = int(jitflops.FlopCountAnalysis(model, {**inputs, **extra}, backend=backend, attention="masked").total())
                except Exception as error:
                    setattr(result, f"{backend}_error", f"mask-aware{padded}: {type(error).__name__}: {str(error)[:300]}")
    try:  # training mode: dropout, batch statistics, the backward's gradients
        jitflops.FlopCountAnalysis(model.train(), inputs, backend="dispatch", backward=True).total()
    except Exception as error:
        result.training_error = f"{type(error).__name__}: {str(error)[:300]}"
    finally:
        model.eval()
    result.changed = _changed(before, _tensor_states(model))
    result.unsupported = dict(unsupported)
    result.status = "counted"
    result.seconds = round(time.perf_counter() - start, 2)
    return result


def _counts_on_meta(model_class: Any, config: Any, inputs: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The default count of ``model_class(config)`` built on the meta device, on ``inputs`` moved to
    meta and on ``inputs`` as they are (the CPU), or the error's text; and which backend counted."""
    import torch
    from torch.utils import _pytree as pytree

    import jitflops

    with torch.device("meta"):
        model = model_class(config).eval()
    counts: dict[str, Any] = {}
    counted_by = ""
    for inputs_on, given in (("meta", pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), inputs)), ("cpu", inputs)):
        try:
            analysis = jitflops.FlopCountAnalysis(model, given)
            counts[inputs_on], counted_by = int(analysis.total()), analysis.counted_by
        except Exception as error:
            counts[inputs_on] = f"{type(error).__name__}: {str(error)[:300]}"
    return counts, counted_by


_MISSING = re.compile(r"missing \d+ required positional arguments?: (.*)")


def _missing_arguments(error: Exception) -> list[str]:
    """The arguments a forward said it misses (``input_ids`` where it asks for ids or embeddings)."""
    if "You have to specify either input_ids or inputs_embeds" in str(error):
        return ["input_ids"]
    found = _MISSING.search(str(error))
    return re.findall(r"'(\w+)'", found.group(1)) if found else []


def _with_arguments(model: Any, config: Any, candidate: dict[str, Any], names: list[str]) -> Optional[dict[str, Any]]:
    """``candidate`` with the arguments ``names`` made (ids, an image, a time series' padding and
    frequency), less what the forward does not take; None where a name has no recipe."""
    import torch

    parameters = inspect.signature(model.forward).parameters
    takes_any = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    changed = {key: value for key, value in candidate.items() if takes_any or key in parameters}
    vocabulary = _nested(config, "vocab_size") or 100
    for name in names:
        if name in ("input_ids", "qformer_input_ids"):
            changed[name] = torch.randint(0, min(vocabulary, 100), (1, SEQUENCE))
        elif name == "pixel_values":
            size = getattr(config, "image_size", 32)
            size = size[0] if isinstance(size, (list, tuple)) else size
            changed[name] = torch.randn(1, getattr(config, "num_channels", 3), size, size)
        elif name == "past_values_padding" and "past_values" in changed:
            changed[name] = torch.zeros_like(changed["past_values"][..., 0])
        elif name == "freq":
            changed[name] = torch.zeros(1, 1, dtype=torch.long)
        else:
            return None
    return changed


def _asked_for(model: Any, config: Any, candidate: dict[str, Any], error: Exception) -> Optional[dict[str, Any]]:
    """The inputs changed as the model's error asks: arguments it misses, the image tokens a
    multimodal model wants in its ids, or the patches an any-resolution model splits its image into
    (None: it asks for nothing this can make)."""
    missing = _missing_arguments(error)
    if missing:
        return _with_arguments(model, config, candidate, missing)
    wanted, patches = _image_tokens_wanted(error), _patches_wanted(error)
    hidden = getattr(getattr(config, "text_config", None) or config, "hidden_size", None)
    if wanted and hidden and wanted > 2048 and wanted % hidden == 0:  # some models report the features' elements
        wanted //= hidden
    pixels = candidate.get("pixel_values")
    if patches and pixels is not None and pixels.dim() == 4:
        return {**candidate, "pixel_values": pixels.unsqueeze(1).expand(-1, patches, -1, -1, -1).contiguous()}
    if not wanted:
        return None
    changed = {**candidate, "input_ids": _inputs(model, config, wanted)["input_ids"]}
    if "mm_token_type_ids" in changed:
        changed["mm_token_type_ids"] = (changed["input_ids"] == _image_token_id(config)).long()
    return changed


def _first_that_runs(model: Any, config: Any, inputs: dict[str, Any]) -> tuple[Optional[float], dict[str, Any]]:
    """``FlopCounterMode``'s flops of the first inputs the model runs on, and those inputs:
    ``inputs``, then each of :func:`_input_variants`, each changed up to twice more as its errors
    ask (:func:`_asked_for`); the first error where none runs."""
    first: Optional[Exception] = None
    for variant in [inputs, *_input_variants(model, config, inputs)]:
        candidate: Optional[dict[str, Any]] = variant
        for _ in range(3):
            if candidate is None:
                break
            try:
                return _eager_flops(model, candidate), candidate
            except Exception as error:
                first = first or error
                candidate = _asked_for(model, config, candidate, error)
    raise first


def _eager_flops(model: Any, inputs: dict[str, Any]) -> Optional[float]:
    """The model's eager forward under ``FlopCounterMode``: its flops (a multiply-add is two).
    None where ``FlopCounterMode`` itself fails and the forward runs without it: its module tracker
    asserts (``Expected gradient function to be set``) on Idefics2 and SAM."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(**inputs)
    except AssertionError as error:
        if "Expected gradient function to be set" not in str(error):
            raise
        with torch.no_grad():
            model(**inputs)
        return None
    return counter.get_total_flops()


class _TimeLimit(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _TimeLimit()


def run_with_time_limit(task: tuple[str, str]) -> dict:
    """One architecture in a worker process, stopped after ``TIME_LIMIT_S``; a crash is reported, never raised."""
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(TIME_LIMIT_S)
    try:
        return asdict(run_architecture(*task))
    except _TimeLimit:
        return asdict(ArchitectureResult(*task, status="timeout"))
    except BaseException:
        return asdict(ArchitectureResult(*task, status="crashed", error=traceback.format_exc()[-300:]))
    finally:
        signal.alarm(0)


def _report(result: dict, index: int, total: int) -> None:
    faults = [k for k in ("error", "jit_error", "dispatch_error", "training_error", "changed") if result.get(k)] + (["unsupported"] if result.get("unsupported") else [])
    if result["status"] == "counted" and result["jit"] != result["dispatch"]:
        faults.append(f"jit {result['jit']} != dispatch {result['dispatch']}")
    if not ArchitectureResult(**result).masked_agree:
        faults.append(f"mask-aware {result['masked']}")
    if result.get("export_error"):
        faults.append(f"export: {result['export_error'][:100]}")
    elif result["status"] == "counted" and (result["export"] != result["dispatch"] or result["export_modules_differ"]):
        faults.append(f"export {result['export']} != dispatch {result['dispatch']} in {result['export_modules_differ'][:3]}")
    print(f"[{index}/{total}] {result['model_type']}: {result['status']} {' '.join(faults)}", flush=True)


def run_all(tasks: list[tuple[str, str]], workers: int) -> list[dict]:
    """Every task in worker processes, results in order. A worker that hangs where the time limit
    cannot reach (a wait inside torch's C++) is stopped with its pool, its task reported as a
    timeout, and the tasks after it go to a fresh pool."""
    results: list[dict] = []
    remaining = list(tasks)
    while remaining:
        with multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=20) as pool:
            running = pool.imap(run_with_time_limit, remaining)
            for position, task in enumerate(remaining):
                try:
                    result = running.next(timeout=TIME_LIMIT_S + 60)
                except multiprocessing.TimeoutError:
                    results.append(asdict(ArchitectureResult(*task, status="timeout", error="hung past the time limit: its worker was stopped")))
                    _report(results[-1], len(results), len(tasks))
                    remaining = remaining[position + 1:]
                    pool.terminate()
                    break
                results.append(result)
                _report(result, len(results), len(tasks))
            else:
                remaining = []
    return results


def architectures() -> list[tuple[str, str]]:
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return [(model_type, name if isinstance(name, str) else name[0]) for model_type, name in MODEL_MAPPING_NAMES.items()]


def decoder_types() -> frozenset[str]:
    """The model types transformers gives a causal-LM head: the decoders whose masks are compared."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def summarise(results: list[dict]) -> dict[str, Any]:
    ran = [r for r in results if r["status"] == "counted"]
    typed = [ArchitectureResult(**r) for r in ran]
    return {
        "architectures": len(results),
        "eager forward runs": len(ran),
        "counted cleanly by both backends": sum(r.clean for r in typed),
        "not cleanly, for a known reason of the model or torch": sum(not r.clean and bool(r.known_difference) for r in typed),
        "not cleanly, unexplained": sum(not r.clean and not r.known_difference for r in typed),
        "JIT fails": sum(bool(r.jit_error) for r in typed),
        "counted by the JIT's fallback, the dispatch backend": sum(r.counted_by == "dispatch" for r in typed),
        "default count read from the calls, without the tracer": sum(r.jit_from_calls for r in typed),
        "read from the calls, a module's count not the JIT trace's": sum(bool(r.calls_modules_differ) for r in typed),
        "dispatch fails": sum(bool(r.dispatch_error) for r in typed),
        "training-mode dispatch count with backward fails": sum(bool(r.training_error) for r in typed),
        "model not given back as it was": sum(bool(r.changed) for r in typed),
        "with unsupported ops": sum(bool(r.unsupported) for r in typed),
        "JIT != dispatch": sum(r.jit is not None and r.dispatch is not None and r.jit != r.dispatch for r in typed),
        "decoders counted mask-aware, unpadded and padded": sum(len(r.masked) == 4 for r in typed),
        "decoders counted mask-aware unpadded only (the eager forward fails on a padding mask)": sum(bool(r.padded_error) for r in typed),
        "decoders whose mask-aware JIT != dispatch": sum(not r.masked_agree for r in typed),
        "below FlopCounterMode / 2": sum(r.jit is not None and r.flop_counter is not None and 2 * r.jit < r.flop_counter for r in typed),
        "build or eager forward fails": sum(r["status"] in ("build failed", "eager failed", "timeout", "crashed") for r in results),
        "export (strict=False) of an eager forward that runs": sum(r.export is not None for r in typed),
        "export fails": sum(bool(r.export_error) for r in typed),
        "export == dispatch, in total and in every module": sum(r.export is not None and r.export == r.dispatch and not r.export_modules_differ for r in typed),
        "export != dispatch": sum(r.export is not None and (r.export != r.dispatch or bool(r.export_modules_differ)) for r in typed),
        "export with unsupported ops": sum(bool(r.export_unsupported) for r in typed),
        "built on meta, counted as on the CPU on inputs on meta and on the CPU": sum(r.meta_agrees for r in typed),
        "built on meta, the forward reads a value": sum(r.meta_reads_a_value for r in typed),
        "built on meta, not counted as on the CPU for another reason": sum(bool(r.meta) and not r.meta_agrees and not r.meta_reads_a_value for r in typed),
    }


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated model types")
    parser.add_argument("--sample", type=int, help="a random sample of this many architectures")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decoders", action="store_true", help="only the architectures with a causal-LM head")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    tasks = architectures()
    if args.only:
        wanted = set(args.only.split(","))
        tasks = [task for task in tasks if task[0] in wanted]
    if args.decoders:
        tasks = [task for task in tasks if task[0] in decoder_types()]
    if args.sample:
        tasks = random.Random(args.seed).sample(tasks, args.sample)
    results = run_all(tasks, args.workers)
    summary = summarise(results)
    args.output.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    sys.exit(main())
