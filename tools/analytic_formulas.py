"""jitflops' training FLOPs per token against the analytic formulas, for four public
architectures built from their configurations on the meta device (no weights, seconds each).

    python tools/analytic_formulas.py [--seq 4096] [--json tools/analytic_formulas.json]

Prints the README's table: per model, jitflops' count (its forward counted, x3 for training), 6N
with the active parameters, Kaplan's, Megatron's and torchtitan's formulas, and the terms that
explain each difference, computed from the model's own modules: the attention products, the output
layer, the router, and what a formula's layer shape leaves out.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jitflops import FlopCountAnalysis  # noqa: E402
from jitflops.profiling.per_token import TRAINING_PASSES, LanguageModelSizes, analytic_flops_per_token  # noqa: E402
from jitflops.core.table import pipe_table  # noqa: E402

CONFIGS = {
    "Llama-3-8B": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                                 num_key_value_heads=8, vocab_size=128256)),
    "Llama-3-70B": ("llama", dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                                  num_key_value_heads=8, vocab_size=128256)),
    "Mixtral-8x7B": ("mixtral", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                                     num_key_value_heads=8, vocab_size=32000, num_local_experts=8, num_experts_per_tok=2)),
    "DeepSeek-V3": ("deepseek_v3", dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
                                        first_k_dense_replace=3, num_attention_heads=128, num_key_value_heads=128, n_routed_experts=256,
                                        n_shared_experts=1, num_experts_per_tok=8, q_lora_rank=1536, kv_lora_rank=512,
                                        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, vocab_size=129280)),
}
"""The published configurations' sizes (the Hub's config.json files), by transformers' model type."""


def build(model_type: str, sizes: dict) -> torch.nn.Module:
    import transformers

    config = transformers.AutoConfig.for_model(model_type, **sizes)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # the checkpoints' dtype
    try:
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(config).eval()
    finally:
        torch.set_default_dtype(previous)


def active_parameters(model: torch.nn.Module, experts: int, top_k: int) -> int:
    """Parameters one token uses, without the input embedding (a lookup): a routed expert's weights
    count top_k / experts of theirs; shared experts, the router and everything else whole."""
    total = 0
    for name, parameter in model.named_parameters():
        if "embed_tokens" in name:
            continue
        routed = ".mlp.experts." in name
        total += parameter.numel() * top_k // experts if routed else parameter.numel()
    return total


def measure(name: str, seq: int) -> dict:
    model_type, sizes = CONFIGS[name]
    model = build(model_type, sizes)
    config = model.config
    experts = getattr(config, "num_local_experts", None) or getattr(config, "n_routed_experts", None) or 1
    top_k = getattr(config, "num_experts_per_tok", 1) if experts > 1 else 1
    head_dim = getattr(config, "qk_nope_head_dim", 0) + getattr(config, "qk_rope_head_dim", 0) or config.hidden_size // config.num_attention_heads
    model_sizes = LanguageModelSizes(active_parameters(model, experts, top_k), config.num_hidden_layers, config.hidden_size,
                                     config.num_attention_heads, head_dim, config.vocab_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = FlopCountAnalysis(model, torch.zeros(1, seq, dtype=torch.long, device="meta"))
        macs = analysis.total()
        by_op = analysis.by_operator()
    per_token = lambda value: TRAINING_PASSES * 2 * value / seq  # noqa: E731  training FLOPs per token of forward MACs
    attention = sum(v for op, v in by_op.items() if "attention" in op)
    return {
        "model": name,
        "active_params": model_sizes.active_params,
        "jitflops": per_token(macs),
        **analytic_flops_per_token(model_sizes, seq),
        "attention": per_token(attention),
        "lm_head": per_token(analysis.total("lm_head")),
        "sizes": model_sizes.__dict__,
        "counted_by": analysis.counted_by,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--json", default=str(Path(__file__).with_name("analytic_formulas.json")))
    options = parser.parse_args()
    rows = [measure(name, options.seq) for name in CONFIGS]
    giga = lambda value: f"{value / 1e9:.2f}"  # noqa: E731
    table = [
        [row["model"], f"{row['active_params'] / 1e9:.2f} B", giga(row["jitflops"]), giga(row["6N"]), giga(row["kaplan"]),
         giga(row["megatron"]), giga(row["torchtitan"]), giga(row["attention"]), giga(row["lm_head"])]
        for row in rows
    ]
    print(f"Training GFLOPs per token at sequence {options.seq} (forward x 3)")
    print(pipe_table(table, ["model", "active N", "jitflops", "6N", "Kaplan", "Megatron", "torchtitan", "of which attention", "of which lm_head"]))
    Path(options.json).write_text(json.dumps({"seq": options.seq, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
