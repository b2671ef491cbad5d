"""How far one calibration can be trusted on this machine: the zoo's predicted forwards on specs
calibrated in one phase and in three (``jitflops calibrate --phases``), against the same timed
forwards, round after round.

Each round times the zoo's forwards in turn (half before the calibrations, half after, as
``tools/time_accuracy.py`` does), calibrates twice in processes of their own (one phase, then
three; the other order in every other round: a drift of the machine within the round falls on
each alike), each followed by ``SETTLE_S``, and prices every model's one recording (made on the
one phase's spec) on both specs.
Per model and way of calibrating: the error's median over the rounds with its spread, and the
spread of the predicted time itself (the largest round's over the smallest's), which no drift of
the timed forwards enters: how far a user's prediction moves with the calibration they happened to
run.

    python tools/calibration_stability.py                  # 5 rounds (about 15 minutes on 2 cores)
    python tools/calibration_stability.py --rounds 2 --models bert-base resnet-50
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

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from jitflops.estimates.roofline import PredictedTimeAnalysis  # noqa: E402
from time_accuracy import MODELS, calibrated, forwards, instantiate, settle, summary  # noqa: E402

WAYS = {"one phase": ("--phases", "1"), "three phases": ("--phases", "3")}


def run(names: list[str], rounds: int, repeats: int) -> dict[str, Any]:
    models = {name: instantiate(name) for name in names}
    rows = []
    for index in range(rounds):
        before = forwards(models, (repeats + 1) // 2)[1]
        specs = {}
        for way in (list(WAYS) if index % 2 == 0 else list(WAYS)[::-1]):
            specs[way] = calibrated(*WAYS[way])
            settle()
        after = forwards(models, repeats // 2 + 1)[1]
        row: dict[str, Any] = {way: {} for way in WAYS}
        row["devices"] = {way: json.loads(spec.to_json()) for way, spec in specs.items()}
        for name, (model, args, kwargs) in models.items():
            measured = statistics.median(before[name] + after[name])
            recording = PredictedTimeAnalysis(model, args, kwargs, device=specs["one phase"]).unsupported_ops_warnings(False).uncalled_modules_warnings(False)
            for way, spec in specs.items():
                predicted = recording.of_same_recording(PredictedTimeAnalysis, device=spec).total()
                row[way][name] = {"measured_s": measured, "predicted_s": predicted, "error": predicted / measured - 1}
        rows.append(row)
        print(f"round {index + 1}: " + "; ".join(f"{way}: " + ", ".join(f"{name} {value['error']:+.0%}" for name, value in row[way].items()) for way in WAYS),
              flush=True)
    result = {way: {name: {"error": summary([row[way][name]["error"] for row in rows]),
                           "predicted_spread": max(row[way][name]["predicted_s"] for row in rows) / min(row[way][name]["predicted_s"] for row in rows)}
                    for name in names} for way in WAYS}
    return {"rounds": rows, "summary": result, "torch": torch.__version__}


def table(result: dict[str, Any], rounds: int) -> str:
    lines = [f"Median over {rounds} rounds (spread: the lowest and highest round); the predicted time's spread is its largest round over its smallest", "",
             "| model | " + " | ".join(f"error, {way} | predicted spread, {way}" for way in WAYS) + " |", "|---|" + "---|---|" * len(WAYS)]
    names = list(next(iter(result.values())))
    for name in names:
        cells = [f"{entry['error']['median']:+.0%} ({entry['error']['low']:+.0%} to {entry['error']['high']:+.0%}) | {entry['predicted_spread']:.2f}x"
                 for entry in (result[way][name] for way in WAYS)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for way in WAYS:
        within = sum(abs(result[way][name]["error"]["median"]) <= 0.15 for name in names)
        widest = max(result[way][name]["error"]["high"] - result[way][name]["error"]["low"] for name in names)
        spreads = statistics.median(result[way][name]["predicted_spread"] for name in names)
        lines.append(f"\n{way}: {within} of {len(names)} within 15% (median over rounds); the widest spread of a model's error over rounds "
                     f"{widest:.0%}; the median predicted spread {spreads:.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", nargs="*", default=MODELS, choices=MODELS)
    parser.add_argument("--repeats", type=int, default=7, help="interleaved forwards of each model per round")
    parser.add_argument("--json", default=str(REPO / "tools" / "calibration_stability_results.json"))
    options = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    result = run(options.models, options.rounds, options.repeats)
    Path(options.json).write_text(json.dumps(result, indent=1) + "\n")
    print(table(result["summary"], options.rounds))


if __name__ == "__main__":
    main()
