"""The decode step's predicted time against its measurement, where the host decides it: tiny decoders of fourteen families.

A decode step of a small model at batch 1 is the host's: its kernels take a microsecond or so, and the
step is the model's Python, its module calls and the calls of some 150 to 250 ops. Each family here is
built from its transformers config at width 64, 2 layers and a vocabulary of 1,000 (random weights),
prefilled with 128 tokens; a step is the next token's forward with the cache, which is cropped back
to 128 after each, timed 400 times (the median of the last 300).

Each round times each decoder's steps in turn, calibrates the machine afresh (``jitflops
calibrate`` in a process of its own, as ``tools/time_accuracy.py`` does), lets the machine settle
(``SETTLE_S``: the VM's host takes back what the calibration's process freed), times them again, and
predicts each first decode step (``predict_generation``) against the mean of the two timings. A
decoder's error is its median over the rounds, with its spread. On this 2-core VM the same step
moves by half within minutes, with nothing else running (Llama's 1.35 to 2.73 ms, 2026-12-07), and
calibration's prices with it: a round's error is as much the machine's drift as the prediction's.

With ``--loop-rate`` each round also prices the same steps with the model's Python at the rate of
a loop of its own (calibration's glue module less a module call, each timed in a loop: how
``jitflops calibrate`` priced it until 2026-12-07), timed in this process right after the
calibration: a paired comparison of the two prices on the same measurements.

The set ``seen`` is the seven families whose steps were measured while the price of the model's
Python was chosen (timed between a tour of varied ops, 2026-12-07: they came out -11% to -45% at the
price of a loop, -30% to +3% at the tour's); ``held out`` is seven families first measured after
that choice was made.

    python tools/decode_accuracy.py                 # 3 rounds (about 5 minutes on 2 cores)
    python tools/decode_accuracy.py --rounds 1 --families llama gpt2
    python tools/decode_accuracy.py --rounds 5 --loop-rate  # and each step priced at the loop's rate
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from jitflops.estimates.devices import DeviceSpec  # noqa: E402
from jitflops.estimates.generation_time import predict_generation  # noqa: E402
from time_accuracy import calibrated, settle, summary  # noqa: E402

WIDTH, LAYERS, VOCAB, PROMPT = 64, 2, 1000, 128
STEPS, WARM_UP = 400, 100

FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("seen", "Llama", dict(intermediate_size=172, num_attention_heads=8, num_key_value_heads=2)),
    "gpt2": ("seen", "GPT2:GPT2LMHeadModel", dict(n_embd=WIDTH, n_layer=LAYERS, n_head=4)),
    "opt": ("seen", "OPT", dict(ffn_dim=256, num_attention_heads=4, word_embed_proj_dim=WIDTH)),
    "qwen2": ("seen", "Qwen2", dict(intermediate_size=172, num_attention_heads=8, num_key_value_heads=2)),
    "gpt-neox": ("seen", "GPTNeoX", dict(intermediate_size=256, num_attention_heads=4)),
    "phi": ("seen", "Phi", dict(intermediate_size=256, num_attention_heads=4)),
    "gemma": ("seen", "Gemma", dict(intermediate_size=172, num_attention_heads=4, num_key_value_heads=1, head_dim=16)),
    "mistral": ("held out", "Mistral", dict(intermediate_size=172, num_attention_heads=8, num_key_value_heads=2)),
    "falcon": ("held out", "Falcon", dict(num_attention_heads=4)),
    "bloom": ("held out", "Bloom", dict(n_head=4, n_layer=LAYERS)),
    "stablelm": ("held out", "StableLm", dict(intermediate_size=172, num_attention_heads=4, num_key_value_heads=4)),
    "starcoder2": ("held out", "Starcoder2", dict(intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)),
    "olmo": ("held out", "Olmo", dict(intermediate_size=172, num_attention_heads=4)),
    "gptj": ("held out", "GPTJ", dict(n_embd=WIDTH, n_layer=LAYERS, n_head=4, rotary_dim=8)),
}
"""Each family's set, its transformers name (``<name>Config``, ``<name>ForCausalLM``, or the
model's class after a colon) and the config's arguments besides the width, depth and vocabulary
(GPT-2's, Bloom's and GPT-J's named their way)."""


def build(family: str) -> torch.nn.Module:
    import transformers

    _, names, arguments = FAMILIES[family]
    name, _, model_class = names.partition(":")
    config = getattr(transformers, f"{name}Config")(vocab_size=VOCAB, **{"hidden_size": WIDTH, "num_hidden_layers": LAYERS, **arguments})
    config.bos_token_id = config.eos_token_id = config.pad_token_id = 0
    torch.manual_seed(0)
    return getattr(transformers, model_class or f"{name}ForCausalLM")(config).eval()


def decode_step(model: torch.nn.Module, prompt: torch.Tensor) -> float:
    """The median step of the next token's forward with the cache at ``PROMPT`` positions."""
    from transformers import DynamicCache

    token = torch.tensor([[5]])
    times = []
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(prompt, cache=cache, use_cache=True)
        for _ in range(STEPS):
            started = time.perf_counter()
            model(token, cache=cache, use_cache=True)
            times.append(time.perf_counter() - started)
            cache.crop(-1)
    return statistics.median(times[WARM_UP:])


def at_loop_rate(spec: DeviceSpec) -> DeviceSpec:
    """``spec`` with the model's Python priced as a loop of calibration's glue module runs it (less
    a module call's loop, over the glue's instructions): the price before 2026-12-07."""
    from jitflops.frontends.bytecode_count import BytecodeCounter
    from jitflops.timing.calibration.host import _Glue, _per_call

    glue, identity, one, cpu = _Glue(), torch.nn.Identity(), torch.ones(1), torch.device("cpu")
    with BytecodeCounter() as counter:
        glue(one)
    rate = (_per_call(cpu, lambda: glue(one)) - _per_call(cpu, lambda: identity(one))) / counter.count
    return dataclasses.replace(spec, host_s={**spec.host_s, "bytecode": max(0.0, rate)})


def run(families: list[str], rounds: int, loop_rate: bool = False) -> dict[str, Any]:
    models = {family: build(family) for family in families}
    prompt = torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    rows = []
    for index in range(rounds):
        before = {family: decode_step(model, prompt) for family, model in models.items()}  # on both sides of the calibration:
        spec = calibrated()                                                                  # the machine's speed drifts within a minute
        at_loop = at_loop_rate(spec) if loop_rate else None
        settle()
        after = {family: decode_step(model, prompt) for family, model in models.items()}
        row = {}
        for family, model in models.items():
            measured = (before[family] + after[family]) / 2
            predicted = predict_generation(model, prompt, 2, device=spec).first_decode_s
            row[family] = {"measured_s": measured, "measured_before_s": before[family], "measured_after_s": after[family],
                           "predicted_s": predicted, "error": predicted / measured - 1}
            if at_loop is not None:
                row[family]["error_at_loop_rate"] = predict_generation(model, prompt, 2, device=at_loop).first_decode_s / measured - 1
        rows.append(row)
        print(f"round {index + 1}: " + ", ".join(f"{family} {value['error']:+.0%}" for family, value in row.items()), flush=True)
    result = {family: {"set": FAMILIES[family][0], "measured_s": statistics.median(row[family]["measured_s"] for row in rows),
                       "error": summary([row[family]["error"] for row in rows])} for family in families}
    if loop_rate:
        for family in families:
            result[family]["error_at_loop_rate"] = summary([row[family]["error_at_loop_rate"] for row in rows])
    return {"rounds": rows, "summary": result, "torch": torch.__version__}


def table(result: dict[str, Any], rounds: int) -> str:
    def spread(error: dict[str, float]) -> str:
        return f"{error['median']:+.0%} ({error['low']:+.0%} to {error['high']:+.0%})"

    paired = all("error_at_loop_rate" in entry for entry in result.values())
    lines = [f"Median over {rounds} rounds (spread: the lowest and highest round)", "",
             "| decoder (width 64, 2 layers) | decode step | error |" + (" at the loop's rate |" if paired else "") + " set |",
             "|---|---|---|" + ("---|" if paired else "") + "---|"]
    for family, entry in result.items():
        loop = f" {spread(entry['error_at_loop_rate'])} |" if paired else ""
        lines.append(f"| {family} | {entry['measured_s'] * 1e3:.2f} ms | {spread(entry['error'])} |{loop} {entry['set']} |")
    for key, priced in (("error", "calibrated"), ("error_at_loop_rate", "at the loop's rate")):
        for group in ("seen", "held out"):
            errors = [abs(entry[key]["median"]) for entry in result.values() if entry["set"] == group and key in entry]
            if errors:
                lines.append(f"\n{priced}, {group}: {sum(error <= 0.15 for error in errors)} of {len(errors)} within 15%, "
                             f"median absolute error {statistics.median(errors):.0%}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--families", nargs="*", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--loop-rate", action="store_true", help="also price each step with the Python at a loop's rate (paired)")
    parser.add_argument("--json", default=str(REPO / "tools" / "decode_results.json"))
    options = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    document = run(options.families, options.rounds, options.loop_rate)
    print(table(document["summary"], options.rounds))
    Path(options.json).write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
