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
import tempfile
import types
from pathlib import Path

import pytest

from helpers import run_forked

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
    environment = {**os.environ, "TMPDIR": str(tmp_path), "MPLBACKEND": "Agg"}
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # blocks run from the repository's root, as a reader does
    if language == "python":
        with tempfile.NamedTemporaryFile("r", suffix=".txt") as output:
            exit_code = run_forked(_run_python_block, code, str(tmp_path), environment, output.name, timeout=600)
            assert exit_code == 0, f"{where} failed:\n{output.read()[-6000:]}"
        return
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=environment)
    assert run.returncode == 0, f"{where} failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"


def _run_python_block(code: str, folder: str, environment: dict[str, str], output: str) -> None:
    """A Python block as ``python -c`` runs it (its ``__main__``, its folder, its environment, its
    output to ``output``), in a process forked from the tests' fork server
    (:func:`helpers.run_forked`), where torch, transformers and jitflops are imported already: 3 to
    8 s of each block's time in a fresh interpreter. The block's own imports still bind its names."""
    os.chdir(folder)
    os.environ.clear()
    os.environ.update(environment)
    tempfile.tempdir = None  # TMPDIR, read again
    stream = os.open(output, os.O_WRONLY | os.O_TRUNC)
    os.dup2(stream, 1)
    os.dup2(stream, 2)
    main = types.ModuleType("__main__")
    sys.modules["__main__"], sys.argv = main, ["-c"]
    exec(compile(code, "<string>", "exec"), main.__dict__)


def test_every_docs_page_is_linked_and_every_link_resolves():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in readme, f"README does not link docs/{page.name}"
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+\.(?:md|png|cff))(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links a missing {target}"
    readme_lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    # short in lines and in characters: one line of 5,800 characters once hid every run's history under the line count
    assert len(readme_lines) <= 260 and sum(map(len, readme_lines)) <= 21_000
