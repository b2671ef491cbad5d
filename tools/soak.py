"""Soak: many analyse, profile and export cycles in one process, watching its resident memory.

Each cycle counts a model with both backends, profiles it (a timed pass and the per-op table) and
writes every export. The resident set size (``VmRSS``) is read after a warm-up and at the end; a
leak shows as growth proportional to the cycles.

    python tools/soak.py                    # 1,000 cycles on the built-in convnet
    python tools/soak.py --cycles 200 --example transformer
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jitflops import FlopCountAnalysis, profile_model, write_chrome_trace, write_html, write_json, write_ops_csv  # noqa: E402
from jitflops.examples import BUILTIN_EXAMPLES  # noqa: E402


def resident_mib() -> float:
    """This process's resident set size, from ``/proc`` (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def cycle(model, args, kwargs, directory: Path) -> None:
    FlopCountAnalysis(model, args, kwargs).by_module()
    FlopCountAnalysis(model, args, kwargs, backend="dispatch").by_module()
    profile = profile_model(model, args, kwargs, warm_up=0, repeats=1, with_ops=True)
    write_json(profile, str(directory / "profile.json"))
    write_ops_csv(profile, str(directory / "ops.csv"))
    write_chrome_trace(profile, str(directory / "trace.json"))
    write_html(profile, str(directory / "report.html"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--warm-up", type=int, default=50, help="cycles before the first reading")
    parser.add_argument("--example", default="convnet", choices=sorted(BUILTIN_EXAMPLES))
    parser.add_argument("--json", default=str(REPO / "tools" / "soak_results.json"))
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    model, positional, keywords = BUILTIN_EXAMPLES[args.example].instantiate()
    start = time.perf_counter()
    readings = []
    with tempfile.TemporaryDirectory() as directory:
        for index in range(1, args.cycles + 1):
            cycle(model, positional, keywords, Path(directory))
            if index == args.warm_up or index % 100 == 0 or index == args.cycles:
                gc.collect()
                readings.append((index, round(resident_mib(), 1)))
                print(f"cycle {index}: {readings[-1][1]} MiB resident", flush=True)
    after_warm_up = next(mib for index, mib in readings if index == args.warm_up)
    result = {
        "example": args.example,
        "cycles": args.cycles,
        "seconds": round(time.perf_counter() - start, 1),
        "resident_mib_after_warm_up": after_warm_up,
        "resident_mib_at_end": readings[-1][1],
        "growth_mib": round(readings[-1][1] - after_warm_up, 1),
        "readings": readings,
    }
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "readings"}, indent=1))


if __name__ == "__main__":
    main()
