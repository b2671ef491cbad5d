"""Built-in example models, and the model zoo the tests and benchmarks run on.

The small models here need nothing but torch. The zoo builds ``transformers`` models from their
config classes with random weights (nothing is downloaded); it needs ``transformers`` installed.
Every entry makes its model and its inputs on the device asked for; large language models can be
made on the ``meta`` device, where they cost no memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn


class ConvNet(nn.Module):
    """A small image classifier: conv, batch norm, pooling and a linear head."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.block(self.stem(x))).flatten(1))


class SelfAttention(nn.Module):
    """Multi-head self-attention through ``F.scaled_dot_product_attention``, with grouped-query heads."""

    def __init__(self, dim: int, heads: int, kv_heads: Optional[int] = None, causal: bool = False) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.causal = heads, kv_heads or heads, causal
        self.head_dim = dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * self.kv_heads * self.head_dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q = self.q(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(batch, length, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=self.kv_heads != self.heads)
        return self.out(attended.transpose(1, 2).reshape(batch, length, dim))


class TransformerBlock(nn.Module):
    """A pre-norm transformer block: attention and an MLP, each with a residual ``x += ...``."""

    def __init__(self, dim: int = 64, heads: int = 4, kv_heads: Optional[int] = None, causal: bool = False) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = SelfAttention(dim, heads, kv_heads, causal)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        out = self.mlp(self.norm2(x))
        out += x  # an in-place residual: the trace sees it too
        return out


class TinyTransformer(nn.Module):
    """Token embedding, a stack of :class:`TransformerBlock` and a language-model head."""

    def __init__(self, vocab: int = 1000, dim: int = 64, depth: int = 2, heads: int = 4, kv_heads: Optional[int] = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, kv_heads, causal=True) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class LSTMTagger(nn.Module):
    """Embedding, a bidirectional two-layer LSTM and a linear tagger."""

    def __init__(self, vocab: int = 1000, dim: int = 32, hidden: int = 48, tags: int = 5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.tagger = nn.Linear(2 * hidden, tags)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        states, _ = self.lstm(self.embed(ids))
        return self.tagger(states)


@dataclass(frozen=True)
class Example:
    """A model factory with the inputs to analyse it on."""

    name: str
    build: Callable[[], nn.Module]
    make_inputs: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]
    description: str = ""
    tags: frozenset[str] = field(default_factory=frozenset)
    config: Optional[Callable[[], Any]] = None
    """A transformers example's configuration, which settings override (:meth:`instantiate`)."""
    build_from: Optional[Callable[[Any], nn.Module]] = None
    """A transformers example's model of a configuration."""

    def instantiate(self, device: str = "cpu", seed: int = 0, settings: Optional[Mapping[str, Any]] = None) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
        """The model in eval mode and its (args, kwargs), all made on ``device``; ``settings``
        override a transformers example's configuration (``{"num_hidden_layers": 2}``)."""
        torch.manual_seed(seed)
        with torch.device(device):
            model = (self._built_from(self.configured(settings)) if settings else self.build()).eval()
            args, kwargs = self.make_inputs()
        return model, args, kwargs

    def _built_from(self, configuration: Any) -> nn.Module:
        assert self.build_from is not None  # set with ``config``, which :meth:`configured` has checked
        return self.build_from(configuration)

    def configured(self, settings: Optional[Mapping[str, Any]] = None) -> Any:
        """A transformers example's configuration with ``settings`` overriding its own."""
        if self.config is None:
            raise ValueError(f"the example {self.name!r} is not built from a configuration: no settings to override")
        config = self.config()
        config.update(dict(settings or {}))
        return config


def _ids(length: int, vocab: int = 1000, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length)) if torch.get_default_device().type != "meta" else torch.zeros(batch, length, dtype=torch.long)


def _image(size: int = 224, batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, size, size)


def _positional(*tensors: Callable[[], torch.Tensor]) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    return lambda: (tuple(make() for make in tensors), {})


BUILTIN_EXAMPLES: dict[str, Example] = {
    example.name: example
    for example in (
        Example("convnet", ConvNet, _positional(lambda: _image(32)), "small CNN on a 32x32 image"),
        Example("transformer", TinyTransformer, _positional(lambda: _ids(128)), "2-block causal transformer LM, 128 tokens"),
        Example("lstm", LSTMTagger, _positional(lambda: _ids(64)), "bidirectional 2-layer LSTM tagger, 64 tokens"),
    )
}


def llama_config(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int = 32000) -> Any:
    import transformers

    return transformers.LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        max_position_embeddings=8192,
    )


def _transformers_example(name: str, model_class: str, config: Callable[[], Any], inputs: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]], description: str, *tags: str) -> Example:
    def build_from(configuration: Any) -> nn.Module:
        import transformers

        return getattr(transformers, model_class)(configuration)

    return Example(name, lambda: build_from(config()), inputs, description, frozenset(("transformers",) + tags), config, build_from)


def _config(class_name: str, **settings: Any) -> Callable[[], Any]:
    def make() -> Any:
        import transformers

        return getattr(transformers, class_name)(**settings)

    return make


def _ids_kwargs(**lengths: int) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    return lambda: ((), {name: _ids(length) for name, length in lengths.items()})


ZOO: dict[str, Example] = {
    example.name: example
    for example in (
        _transformers_example("bert-base", "BertModel", _config("BertConfig"), _positional(lambda: _ids(128)), "BERT-base, 128 tokens", "zoo"),
        _transformers_example("gpt2", "GPT2Model", _config("GPT2Config"), _positional(lambda: _ids(256)), "GPT-2 (124M), 256 tokens", "zoo"),
        _transformers_example(
            "llama-gqa", "LlamaModel", lambda: llama_config(256, 2, 8, 2, 688, vocab=1000), _positional(lambda: _ids(512)),
            "small Llama, grouped-query attention 8/2 heads, 512 tokens", "zoo",
        ),
        _transformers_example(
            "t5-small", "T5Model", _config("T5Config"), _ids_kwargs(input_ids=128, decoder_input_ids=32),
            "T5-small encoder (128 tokens) and decoder (32 tokens)", "zoo",
        ),
        _transformers_example("vit-b16", "ViTModel", _config("ViTConfig"), _positional(_image), "ViT-B/16 at 224", "zoo"),
        _transformers_example("swin-t", "SwinModel", _config("SwinConfig"), _positional(_image), "Swin-T at 224", "zoo"),
        _transformers_example("convnext-t", "ConvNextModel", _config("ConvNextConfig"), _positional(_image), "ConvNeXt-T at 224", "zoo"),
        _transformers_example("resnet-50", "ResNetModel", _config("ResNetConfig"), _positional(_image), "ResNet-50 at 224", "zoo"),
        _transformers_example("mobilenet-v2", "MobileNetV2Model", _config("MobileNetV2Config"), _positional(_image), "MobileNetV2 at 224", "zoo"),
        _transformers_example(
            "bert-large", "BertModel", _config("BertConfig", hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
            _positional(lambda: _ids(512)), "BERT-large, 512 tokens", "large",
        ),
        _transformers_example(
            "vit-l16", "ViTModel", _config("ViTConfig", hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
            _positional(_image), "ViT-L/16 at 224", "large",
        ),
        _transformers_example(
            "llama-1b", "LlamaForCausalLM", lambda: llama_config(2048, 16, 32, 8, 8192, vocab=128256), _positional(lambda: _ids(4096)),
            "Llama-3.2-1B shape with its LM head (1.2B parameters), GQA 32/8 heads, 4096 tokens", "large",
        ),
        _transformers_example(
            "llama-8b", "LlamaForCausalLM", lambda: llama_config(4096, 32, 32, 8, 14336, vocab=128256), _positional(lambda: _ids(2048)),
            "Llama-3-8B shape with its LM head, GQA 32/8 heads, 2048 tokens (use on the meta device)", "large", "meta",
        ),
        _transformers_example(
            "llama-70b", "LlamaModel", lambda: llama_config(8192, 80, 64, 8, 28672), _positional(lambda: _ids(4096)),
            "Llama-2-70B shape, GQA 64/8 heads, 4096 tokens (use on the meta device)", "large", "meta",
        ),
    )
}


def all_examples() -> dict[str, Example]:
    return {**BUILTIN_EXAMPLES, **ZOO}

