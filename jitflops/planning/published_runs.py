"""Published training runs a plan is held against: their model, layout and measured throughput.

Megatron-LM's weak-scaling table on DGX H100 nodes (its README's "Performance Benchmarking"
section, July 2024; ``shared/references/megatron-lm-h100-weak-scaling.md``): GPT models of 1.7B to
462B parameters, a vocabulary of 131,072 tokens, sequences of 4,096, bf16. Each row's model is
built here from its published shape as a transformers GPT with Megatron's defaults (``starcoder2``:
LayerNorm, a 4h GeLU MLP with biases, rotary positions, untied embeddings, full multi-head
attention), on the meta device.

What the table does not say a plan takes as its own assumption, the same for every row: one
sequence per micro-batch, 1F1B, sequence parallelism wherever tensor parallelism is used, no
activation recomputation, a distributed optimizer (ZeRO-1), every overlap the README names. These
rows are predicted, never fitted: no figure of the cost model was tuned on them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .layout import Layout

SEQUENCE = 4096
VOCABULARY = 131072


@dataclass(frozen=True)
class PublishedRun:
    """One row: the model's shape, its layout on ``tp x pp x dp`` H100s, and its published throughput."""

    name: str
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    dp: int
    global_batch: int
    tflops_per_gpu: float
    """Model TFLOP/s per GPU, as published."""

    def model(self) -> nn.Module:
        """The row's GPT on the meta device, in bf16 (nothing allocated)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.for_model("starcoder2", hidden_size=self.hidden, intermediate_size=4 * self.hidden, num_hidden_layers=self.layers,
                                      num_attention_heads=self.heads, num_key_value_heads=self.heads, vocab_size=VOCABULARY,
                                      max_position_embeddings=SEQUENCE, tie_word_embeddings=False)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)

    def layout(self) -> Layout:
        return Layout(dp=self.dp, tp=self.tp, pp=self.pp, zero=1, micro_batch=1, sequence_parallel=self.tp > 1)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp


MEGATRON_H100 = (
    PublishedRun("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8),
    PublishedRun("7.1B", 32, 4096, 30, 2, 1, 48, 192, 465.9),
    PublishedRun("16B", 48, 6144, 32, 4, 1, 48, 192, 489.1),
    PublishedRun("32B", 56, 7168, 48, 8, 1, 48, 192, 459.6),
    PublishedRun("70B", 64, 8192, 84, 8, 2, 48, 384, 419.7),
    PublishedRun("119B", 80, 10240, 92, 8, 4, 48, 768, 420.5),
    PublishedRun("177B", 96, 12288, 96, 8, 6, 48, 1152, 432.8),
    PublishedRun("314B", 128, 16384, 96, 8, 8, 48, 1536, 474.4),
    PublishedRun("462B", 144, 18432, 112, 8, 16, 48, 3072, 459.9),
)
"""Megatron-LM's weak-scaling rows on H100 (device ``h100``, interconnect ``dgx-h100``)."""
