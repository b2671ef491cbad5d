"""Grouped convolutions' predicted time on this machine, in rounds: each layer alone, and RegNets' forwards.

Each round calibrates the machine afresh (``tools/time_accuracy.py``'s ``calibrated``: ``jitflops
calibrate`` in a process of its own), then measures against two predictions on that round's spec:
with its grid of grouped convolutions (``grouped_convolutions``) and without it (the dense
convolutions' curve by FLOPs, as before the grid):

- every grouped convolution of ResNeXt-50 32x4d and of the RegNets below at 224 x 224, batch 1,
  alone (``torch.utils.benchmark``'s median, the prediction of the layer's module with its host
  time);
- the forwards of RegNetX-200MF, RegNetX-1.6GF, RegNetY-800MF (timm's widths, depths and group
  widths, in transformers' ``RegNetConfig``) and ``RegNetConfig()`` (RegNetY-4GF's widths with
  groups of 64), timed interleaved (7 turns).

None of these models or layers is in the zoo, and the grid's cells are 3 x 3 convolutions of
ResNeXt's cardinality 32 (or 256 channels), not these layers. A figure is its median over the rounds
with its spread.

    python tools/convolution_accuracy.py                # 3 rounds, about 3 minutes on 2 cores
    python tools/convolution_accuracy.py --rounds 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.utils.benchmark as benchmark
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_accuracy import REPO, calibrated, forwards, summary  # noqa: E402

from jitflops.estimates.devices import DeviceSpec  # noqa: E402
from jitflops.estimates.roofline import PredictedTimeAnalysis  # noqa: E402

RESNEXT_50 = ((128, 56, 1), (256, 56, 2), (256, 28, 1), (512, 28, 2), (512, 14, 1), (1024, 14, 2), (1024, 7, 1))
"""ResNeXt-50 32x4d's grouped 3 x 3 convolutions at 224 x 224: (channels, input side, stride), 32 groups."""


def regnets() -> dict[str, nn.Module]:
    import transformers

    configs = {"regnetx-200mf": dict(layer_type="x", hidden_sizes=[24, 56, 152, 368], depths=[1, 1, 4, 7], groups_width=8),
               "regnetx-1.6gf": dict(layer_type="x", hidden_sizes=[72, 168, 408, 912], depths=[2, 4, 10, 2], groups_width=24),
               "regnety-800mf": dict(layer_type="y", hidden_sizes=[64, 128, 320, 768], depths=[1, 3, 8, 2], groups_width=16),
               "regnety-4gf (RegNetConfig())": {}}
    torch.manual_seed(0)
    return {name: transformers.RegNetModel(transformers.RegNetConfig(**settings)).eval() for name, settings in configs.items()}


def grouped_layers(models: dict[str, nn.Module], image: torch.Tensor) -> dict[str, tuple[nn.Conv2d, torch.Tensor]]:
    """Each distinct grouped convolution (not depthwise) of ResNeXt-50 and of ``models``, with its input."""
    layers: dict[str, tuple[nn.Conv2d, torch.Tensor]] = {}

    def add(conv: nn.Conv2d, x: torch.Tensor) -> None:
        key = f"{conv.in_channels} ch / {conv.groups} groups, {x.shape[-1]}², stride {conv.stride[0]}"
        layers.setdefault(key, (conv, x.detach().clone()))

    for channels, side, stride in RESNEXT_50:
        add(nn.Conv2d(channels, channels, 3, stride, 1, groups=32, bias=False), torch.randn(1, channels, side, side))
    for model in models.values():
        hooks = [module.register_forward_pre_hook(lambda module, args: add(module, args[0])) for module in model.modules()
                 if isinstance(module, nn.Conv2d) and 1 < module.groups < module.in_channels]
        with torch.no_grad():
            model(image)
        for hook in hooks:
            hook.remove()
    return layers


def predicted(module: nn.Module, x: torch.Tensor, spec: DeviceSpec) -> float:
    return PredictedTimeAnalysis(module, (x,), device=spec).unsupported_ops_warnings(False).uncalled_modules_warnings(False).total()


def run_rounds(rounds: int) -> list[dict[str, Any]]:
    image = torch.randn(1, 3, 224, 224)
    models = regnets()
    layers = grouped_layers(models, image)
    results = []
    for index in range(rounds):
        spec = calibrated()
        without = dataclasses.replace(spec, grouped_convolutions={})
        row: dict[str, Any] = {"layers": {}, "models": {}}
        with torch.no_grad():
            for key, (conv, x) in layers.items():
                measured = benchmark.Timer("conv(x)", globals={"conv": conv, "x": x}, num_threads=torch.get_num_threads()).blocked_autorange(min_run_time=0.2).median
                row["layers"][key] = {"measured_s": measured, "error": predicted(conv, x, spec) / measured - 1,
                                      "error_without_grid": predicted(conv, x, without) / measured - 1}
        times = forwards({name: (model, (image,), {}) for name, model in models.items()}, 7)[1]
        for name, model in models.items():
            measured = statistics.median(times[name])
            row["models"][name] = {"measured_s": measured, "error": predicted(model, image, spec) / measured - 1,
                                   "error_without_grid": predicted(model, image, without) / measured - 1}
        results.append(row)
        print(f"round {index + 1}: " + ", ".join(f"{name} {value['error']:+.0%} (without {value['error_without_grid']:+.0%})"
                                                  for name, value in row["models"].items()), flush=True)
    return results


def reduced(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return {part: {name: {"measured_s": statistics.median(row[part][name]["measured_s"] for row in rounds),
                          "error": summary([row[part][name]["error"] for row in rounds]),
                          "error_without_grid": summary([row[part][name]["error_without_grid"] for row in rounds])} for name in rounds[0][part]}
            for part in ("layers", "models")}


def table(result: dict[str, Any]) -> str:
    def spread(entry: dict[str, float]) -> str:
        return f"{entry['median']:+.0%} ({entry['low']:+.0%} to {entry['high']:+.0%})"
    lines = []
    for part, title in (("layers", "grouped convolution alone"), ("models", "forward")):
        lines += ["", f"| {title} | measured | error, grouped grid | error, dense curve |", "|---|---|---|---|"]
        lines += [f"| {name} | {entry['measured_s'] * 1e3:.2f} ms | {spread(entry['error'])} | {spread(entry['error_without_grid'])} |" for name, entry in result[part].items()]
    errors = [abs(entry["error"]["median"]) for entry in result["layers"].values()]
    before = [abs(entry["error_without_grid"]["median"]) for entry in result["layers"].values()]
    lines += ["", f"layers: median absolute error {statistics.median(errors):.0%} with the grid, {statistics.median(before):.0%} on the dense curve"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=str(REPO / "tools" / "convolution_results.json"))
    options = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    rounds = run_rounds(options.rounds)
    document = {"rounds": rounds, "summary": reduced(rounds), "torch": torch.__version__}
    print(table(document["summary"]))
    Path(options.json).write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
