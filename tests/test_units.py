"""One vocabulary in every output, and one direction between the modules that make and read them.

Every output of one profile is read back and checked against the others under the stated
convention: ``macs`` are multiply-accumulates, ``flops = 2 x macs + elementwise_flops``; fvcore's
API and tables keep fvcore's ``#flops`` (= MACs) and say so.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import re
from pathlib import Path

import pytest
import torch

import jitflops
from jitflops import flop_count_table, format_model_profile, profile_model, profile_to_dict
from jitflops.cli import _modules_csv, _ops_text
from jitflops.examples import TinyTransformer
from jitflops.reports.files import UNITS, ops_to_csv
from jitflops.reports.html_report import profile_to_html
from jitflops.reports.formatting import deepspeed_macs, deepspeed_number

IDS = torch.randint(0, 1000, (2, 16))


@pytest.fixture(scope="module")
def profile():
    return profile_model(TinyTransformer(depth=1).eval(), IDS, repeats=2, with_ops=True, elementwise=True)


def test_every_output_agrees_under_the_stated_convention(profile):
    summary = profile.summary
    macs, elementwise = summary.macs, summary.elementwise_flops
    assert elementwise > 0 and summary.flops == 2 * macs + elementwise

    document = json.loads(json.dumps(profile_to_dict(profile)))
    assert set(UNITS) <= set(document["units"]) and "2 x macs + elementwise_flops" in document["units"]["flops"]
    assert (document["summary"]["macs"], document["summary"]["flops"], document["summary"]["elementwise_flops"]) == (macs, summary.flops, elementwise)
    for module in document["modules"]:
        assert module["flops"] == 2 * module["macs"] + module["elementwise_flops"]
        assert module["macs"] == sum(module["macs_by_op"].values()) and module["elementwise_flops"] == sum(module["elementwise_flops_by_op"].values())

    modules = list(csv.DictReader(io.StringIO(_modules_csv(profile, "order", None))))
    assert (int(modules[0]["macs"]), int(modules[0]["flops"]), int(modules[0]["elementwise_flops"])) == (macs, summary.flops, elementwise)

    ops = list(csv.DictReader(io.StringIO(ops_to_csv(profile.op_rows))))
    counted = [row for row in ops if row["macs"]]
    assert sum(float(row["macs"]) for row in counted) == macs
    assert sum(float(row["elementwise_flops"]) for row in counted) == elementwise
    assert sum(float(row["flops"]) for row in counted) == summary.flops
    assert all(float(row["flops"]) == 2 * float(row["macs"]) + float(row["elementwise_flops"]) for row in counted)

    table = _ops_text(profile, "order", None)
    assert "| MACs" in table and "| FLOPs" in table and "flops = 2 x macs + elementwise_flops" in table

    printed = format_model_profile(profile)
    assert re.search(rf"^fwd MACs per GPU: +{re.escape(deepspeed_macs(macs))}$", printed, re.M)
    assert re.search(rf"^fwd flops per GPU: +{re.escape(deepspeed_number(summary.flops).strip())}$", printed, re.M)

    page = profile_to_html(profile)
    assert f"{macs:,} MACs" in page and f"{summary.flops:,} FLOPs" in page

    fvcore_table = flop_count_table(profile.flop_analysis)
    assert "#flops here are MACs" in fvcore_table
    assert profile.flop_analysis.total() == macs + elementwise  # fvcore's convention: one number per multiply-add or elementwise op


PACKAGE = Path(jitflops.__file__).parent
LAYERS = ("core", "handles", "frontends", "engine", "estimates", "timing", "planning", "profiling", "reports", "deepspeed", "integrations")
"""The package's folders from the bottom up (``docs/code-layout.md``): a module imports only from its
own folder and the folders below it; the modules at the top (the CLI, the examples, the old module
paths) may import any."""


def _layer(module: str) -> int:
    folder = module.split(".")[0]
    return LAYERS.index(folder) if folder in LAYERS else len(LAYERS)


def _package_imports() -> dict[str, set[str]]:
    """For each module of the package, the package modules it imports (anywhere in the file)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        package = name.rpartition(".")[0] if path.name != "__init__.py" else name.removesuffix(".__init__")
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".") if package and package != "__init__" else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, node.module] if node.module else base)
                imported |= {target} if node.module else {".".join([*base, alias.name]) for alias in node.names}
        graph[name] = {target for target in imported if target}
    return graph


def test_no_folder_imports_one_above_it_and_there_is_no_import_circle():
    graph = _package_imports()
    assert {module.split(".")[0] for module in graph if "." in module} >= set(LAYERS)
    upward = sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets if _layer(target) > _layer(module))
    assert not upward, "imports that run upward: " + ", ".join(upward)

    finished: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = path[path.index(module):] + [module]
            raise AssertionError("import circle: " + " -> ".join(cycle))
        if module in finished:
            return
        for target in graph.get(module, ()):
            if target in graph and target != "__init__":
                visit(target, path + [module])
        finished.add(module)

    for module in graph:
        if module != "__init__":
            visit(module, [])
