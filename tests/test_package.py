"""The package as people get it: one version everywhere, its licence, and a built wheel that works
outside the source tree (a fresh virtual environment, the command line, every public name)."""

from __future__ import annotations

import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import jitflops

ROOT = Path(__file__).resolve().parent.parent


def test_one_version_everywhere():
    citation = re.search(r"^version: (\S+)$", (ROOT / "CITATION.cff").read_text(), re.M).group(1)
    assert citation == jitflops.__version__
    assert f"## [{jitflops.__version__}]" in (ROOT / "CHANGELOG.md").read_text()
    built = subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert built.stdout.strip().splitlines()[-1] == jitflops.__version__
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert (ROOT / "jitflops" / "py.typed").exists()


@pytest.mark.skipif(subprocess.run([sys.executable, "-m", "build", "--version"], capture_output=True).returncode != 0, reason="the build package is not installed")
def test_the_built_wheel_works_outside_the_source_tree(tmp_path):
    dist = tmp_path / "dist"
    # --no-isolation: this environment's setuptools builds it (an isolated build installs its own first: 6 of the test's seconds)
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(dist), str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("jitflops-*.whl"))
    assert next(dist.glob("jitflops-*.tar.gz"))
    environment = tmp_path / "env"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    # --no-compile: byte-compiling all of torch took 35 of the test's 60 s; an import compiles what it uses
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-compile", f"torch=={jitflops_torch()}", str(wheel)], check=True, capture_output=True, timeout=600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    example = subprocess.run([str(environment / "bin" / "jitflops"), "--example", "convnet", "--format", "json", "--quiet"], cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert example.returncode == 0, example.stderr
    assert '"macs"' in example.stdout
    assert "Warning" not in example.stderr, example.stderr  # torch's "Failed to initialize NumPy", where numpy is not installed
    names = subprocess.run(
        [str(python), "-c", "import jitflops, pathlib; [getattr(jitflops, name) for name in jitflops.__all__]; "
         "print(jitflops.__version__, pathlib.Path(jitflops.__file__).parent.joinpath('py.typed').exists(), jitflops.__file__)"],
        cwd=elsewhere, capture_output=True, text=True, timeout=300, check=True,
    ).stdout.split()
    assert names[:2] == [jitflops.__version__, "True"] and "site-packages" in names[2]


def test_a_default_count_imports_nothing_it_does_not_use():
    """The first count of a process once imported dynamo (to ask whether the model was compiled) and
    torch.distributed's DTensor and FSDP (to ask whether it was sharded), and ``import jitflops`` the
    export front end's sympy: 0.4 s and 0.25 s of a 2.5 s command line. None can matter before its
    module is imported by someone else; the count is the dispatch backend's, an independent front end."""
    script = (
        "import sys, torch\n"
        "already = set(sys.modules)\n"
        "from jitflops import FlopCountAnalysis\n"
        "from jitflops.examples import ConvNet\n"
        "model, x = ConvNet().eval(), torch.randn(2, 3, 32, 32)\n"
        "flops = FlopCountAnalysis(model, x)\n"
        "total = flops.total()\n"
        "heavy = ('sympy', 'torch._dynamo', 'torch.distributed.tensor', 'torch.distributed.fsdp', 'jitflops.frontends.export_trace')\n"
        "print(sorted(name for name in heavy if name in sys.modules and name not in already), flops.counted_by)\n"
        "print(total == FlopCountAnalysis(model, x, backend='dispatch').total() > 0)\n"
    )
    shown = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout.splitlines()
    assert shown == ["[] jit", "True"]


def jitflops_torch() -> str:
    """The torch this test runs under, as a pin (the CPU build's local version label dropped)."""
    import torch

    return torch.__version__.split("+")[0]
