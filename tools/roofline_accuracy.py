"""The roofline's measured error: calibrate this machine, predict the zoo's forward, time it.

For each model (real weights, its zoo inputs): the predicted forward (:mod:`jitflops.estimates.roofline` with
the spec ``jitflops calibrate`` measures here) against the timed pass's median, and per module, among
the leaf modules that cover 80% of the measured time, the error of each (the whole forward is timed without the
timing hooks, each module between them). Prints a markdown table
(``docs/benchmarks.md`` keeps the latest) and writes the figures as JSON.

    python tools/roofline_accuracy.py
    python tools/roofline_accuracy.py --models bert-base gpt2 --spec spec.json --json /tmp/roofline.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jitflops import profile_model  # noqa: E402
from jitflops.timing.calibration import calibrate  # noqa: E402
from jitflops.estimates.devices import DeviceSpec, device_spec  # noqa: E402
from jitflops.examples import all_examples  # noqa: E402

MODELS = ["bert-base", "gpt2", "vit-b16", "resnet-50", "mobilenet-v2", "t5-small", "llama-gqa"]
COVERED = 0.8


def accuracy(name: str, spec: DeviceSpec, repeats: int) -> dict[str, Any]:
    model, args, kwargs = all_examples()[name].instantiate("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profile = profile_model(model, args, kwargs, repeats=repeats, device=spec)
    leaves = sorted((node for node in profile.root.walk() if not node.children and node.latency is not None and node.predicted_s),
                    key=lambda node: -node.latency.median)
    total, covered, errors = sum(node.latency.median for node in leaves), 0.0, []
    for node in leaves:
        if covered >= COVERED * total:
            break
        covered += node.latency.median
        errors.append((node.name, node.predicted_to_measured - 1))
    summary = profile.summary
    return {
        "model": name,
        "measured_s": summary.unhooked_forward_s,
        "predicted_s": summary.predicted_s,
        "error": summary.predicted_to_measured - 1,
        "bound": summary.bound,
        "intensity": summary.intensity,
        "modules_covering_80pct": len(errors),
        "module_median_abs_error": statistics.median(abs(error) for _, error in errors) if errors else None,
        "module_worst": max(errors, key=lambda item: abs(item[1])) if errors else None,
    }


def table(rows: list[dict[str, Any]], spec: DeviceSpec) -> str:
    lines = [
        f"Device: {spec.name}: {', '.join(f'{key} {value / 1e9:.0f} GFLOP/s' for key, value in spec.peak_flops.items())}, "
        f"copy {spec.memory_bandwidth / 1e9:.1f} GB/s, launch {spec.launch_s * 1e6:.2f} us",
        "",
        "| model | measured | predicted | error | bound | leaf modules covering 80% | their median abs error | worst module |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        worst = f"{row['module_worst'][0]} {row['module_worst'][1]:+.0%}" if row["module_worst"] else "-"
        median = f"{row['module_median_abs_error']:.0%}" if row["module_median_abs_error"] is not None else "-"
        lines.append(f"| {row['model']} | {row['measured_s'] * 1e3:.1f} ms | {row['predicted_s'] * 1e3:.1f} ms | {row['error']:+.0%} | {row['bound']} | "
                     f"{row['modules_covering_80pct']} | {median} | {worst} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=MODELS, choices=sorted(all_examples()))
    parser.add_argument("--spec", help="a device spec (default: calibrate this machine's CPU now)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=str(REPO / "tools" / "roofline_results.json"))
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    spec = device_spec(args.spec) if args.spec else calibrate("cpu")
    rows = [accuracy(name, spec, args.repeats) for name in args.models]
    print(table(rows, spec))
    Path(args.json).write_text(json.dumps({"device": json.loads(spec.to_json()), "models": rows}, indent=1))


if __name__ == "__main__":
    main()
