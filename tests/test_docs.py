"""The README and the docs pages stay true: every Python and shell block runs, on the built-in
examples, and every page is linked.

The README's set-up block (the one that installs) is not run here: CI runs it, and this test checks
that ``.ci/run`` calls its test command verbatim.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```$", re.M | re.S)


def _blocks() -> list[tuple[str, str, str]]:
    found = []
    for page in PAGES:
        for index, match in enumerate(BLOCK.finditer(page.read_text(encoding="utf-8"))):
            found.append((f"{page.relative_to(ROOT)}#{index}", match.group(1), match.group(2)))
    return found


BLOCKS = _blocks()
SET_UP = [block for block in BLOCKS if block[1] == "bash" and "pip install" in block[2]]


def test_the_set_up_block_is_what_ci_runs():
    assert len(SET_UP) == 1 and SET_UP[0][0].startswith("README.md")
    test_command = [line for line in SET_UP[0][2].splitlines() if "pytest" in line]
    assert len(test_command) == 1 and test_command[0] in (ROOT / ".ci" / "run").read_text()


RUN_BY = {"torchrun --nproc_per_node 4 examples/sharded_llama.py": ROOT / "tests" / "test_sharded.py"}
"""Blocks another test runs, with its figures checked against hand counts (each four processes, 20 s):
the block's command, and the test file that must run it."""


def test_a_block_another_test_runs_is_run_there():
    for command, test in RUN_BY.items():
        assert any(code.strip() == command for _, _, code in BLOCKS), f"no block is {command!r}"
        source = test.read_text(encoding="utf-8")
        assert all(f'"{word}"' in source for word in command.split()[1:]), f"{test.name} does not run {command!r}"


@pytest.mark.parametrize("where, language, code", [block for block in BLOCKS if block not in SET_UP and block[2].strip() not in RUN_BY],
                         ids=lambda value: value if "#" in str(value) else "")
def test_every_block_runs(where, language, code, tmp_path):
    environment = {**os.environ, "TMPDIR": str(tmp_path), "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # blocks run from the repository's root, as a reader does
    command = [sys.executable, "-c", code] if language == "python" else ["bash", "-euo", "pipefail", "-c", code]
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=environment)
    assert run.returncode == 0, f"{where} failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"


def test_every_docs_page_is_linked_and_every_link_resolves():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in readme, f"README does not link docs/{page.name}"
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+\.(?:md|png|cff))(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links a missing {target}"
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 260
