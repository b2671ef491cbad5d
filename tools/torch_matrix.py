"""Run the test suite against other torch versions from PyPI, each in a scratch virtual environment.

PyPI's torch wheels for Linux are CUDA builds (about 5 GB each, about 100 s to install); they run
on a machine without a GPU. The suite is the README's test command; its last line is kept per
version, and the table is written to ``tools/torch_matrix.json``.

    python tools/torch_matrix.py 2.6.0 2.15.0
    python tools/torch_matrix.py 2.6.0 --keep          # keep the scratch environment for a rerun
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "tools" / "torch_matrix.json"


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("$", " ".join(command), flush=True)
    return subprocess.run(command, text=True, capture_output=True, **kwargs)


def test_with(version: str, scratch: Path, keep: bool) -> dict:
    environment = scratch / f"torch-{version}"
    python = environment / "bin" / "python"
    started = time.perf_counter()
    try:
        if not python.exists():
            run([sys.executable, "-m", "venv", str(environment)], check=True)
            installed = run([str(python), "-m", "pip", "install", "-q", f"torch=={version}", "-e", f"{REPO}[test]"])
            if installed.returncode:
                return {"torch": version, "result": "install failed", "detail": installed.stderr[-2000:]}
        found = run([str(python), "-c", "import torch; print(torch.__version__)"]).stdout.strip()
        suite = run([str(python), "-m", "pytest", "-q", "-p", "no:warnings"], cwd=REPO)
        last_line = (suite.stdout.strip().splitlines() or ["(no output)"])[-1]
        failures = [line for line in suite.stdout.splitlines() if line.startswith("FAILED") or line.startswith("ERROR")]
        return {
            "torch": found,
            "result": last_line,
            "exit_code": suite.returncode,
            "failures": failures[:50],
            "minutes": round((time.perf_counter() - started) / 60, 1),
        }
    finally:
        if not keep:
            shutil.rmtree(environment, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="+", help="torch versions from PyPI, e.g. 2.6.0 2.15.0")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/jitflops-torch-matrix"))
    parser.add_argument("--keep", action="store_true", help="keep the scratch environments")
    args = parser.parse_args()
    args.scratch.mkdir(parents=True, exist_ok=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for version in args.versions:
        results[version] = test_with(version, args.scratch, args.keep)
        print(json.dumps(results[version], indent=1), flush=True)
        RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
