"""Exports: JSON document, per-op CSV, Chrome trace, HTML picture; written atomically."""

from __future__ import annotations

import csv
import io
import json
import os
import stat

import pytest
import torch

from jitflops import profile_model, write_chrome_trace, write_html, write_json, write_ops_csv
from jitflops.examples import ConvNet
from jitflops.reports.files import SCHEMA
from jitflops.reports.file_output import OutputError, write_text


@pytest.fixture(scope="module")
def profile():
    return profile_model(ConvNet().eval(), torch.randn(2, 3, 16, 16), repeats=3, with_ops=True)


def test_json_document(profile, tmp_path):
    path = tmp_path / "profile.json"
    write_json(profile, str(path))
    document = json.loads(path.read_text())
    assert document["schema"] == SCHEMA and document["convention"] == profile.convention
    assert document["summary"]["macs"] == profile.summary.macs and document["summary"]["flops"] == 2 * profile.summary.macs
    modules = {m["name"]: m for m in document["modules"]}
    assert modules["stem.0"]["macs_by_op"] == {"conv": 2 * 16 * 16 * 16 * 27}
    assert modules[""]["latency"]["iterations"] == 3 and modules[""]["latency"]["median_s"] == profile.root.latency.median
    assert len(document["ops"]) == len(profile.op_rows) and document["ops"][0]["op"] == "aten::conv2d"


def test_ops_csv(profile, tmp_path):
    path = tmp_path / "ops.csv"
    write_ops_csv(profile, str(path))
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert [row["module"] for row in rows[:3]] == ["stem.0", "stem.1", "stem.2"]
    assert float(rows[0]["macs"]) == 2 * 16 * 16 * 16 * 27 and json.loads(rows[0]["input_shapes"])[0] == [2, 3, 16, 16]
    assert int(rows[0]["memory_delta"]) == 2 * 16 * 16 * 16 * 4


def test_chrome_trace_has_one_span_per_module_call(profile, tmp_path):
    path = tmp_path / "trace.json"
    write_chrome_trace(profile, str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    called = [n for n in profile.root.walk() if n.called]
    assert sorted(e["args"]["module"] for e in events) == sorted(n.name for n in called)
    root = next(e for e in events if e["args"]["module"] == "")
    assert all(root["ts"] <= e["ts"] and e["ts"] + e["dur"] <= root["ts"] + root["dur"] + 1e-3 for e in events)


def test_html_report_is_one_offline_file_with_every_module(profile, tmp_path):
    path = tmp_path / "report.html"
    write_html(profile, str(path))
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<script src" not in page and "<link" not in page
    for node in profile.root.walk():
        assert f'"name": "{node.name}"' in page  # the drawing is tested in Chromium: test_html_report.py


def test_write_is_atomic(tmp_path):
    path = tmp_path / "out.txt"
    write_text(str(path), "first")

    with pytest.raises(TypeError):
        write_text(str(path), 123)  # type: ignore[arg-type]  # fails while writing
    assert path.read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_writing_through_a_symbolic_link_keeps_the_link_and_the_mode(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_text(str(link), "new")
    assert link.is_symlink() and target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    target.chmod(0o444)  # read-only: its mode survives a rewrite too (the directory is writable)
    write_text(str(target), "newer")
    assert target.read_text() == "newer" and stat.S_IMODE(target.stat().st_mode) == 0o444
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


def test_a_new_file_gets_the_usual_mode_and_missing_directories_are_created(tmp_path):
    path = tmp_path / "a" / "b" / "report.txt"
    write_text(str(path), "text")
    mask = os.umask(0)
    os.umask(mask)
    assert path.read_text() == "text" and stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


def test_a_directory_as_the_target_is_refused_naming_the_users_path(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(OutputError, match=r"cannot write '.*out': it is a directory"):
        write_text(str(tmp_path / "out"), "x")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # nothing partial left behind


def test_a_parent_that_cannot_be_made_is_named_with_the_users_path(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match=r"cannot write '.*file/report.json': its directory cannot be created"):
        write_text(str(tmp_path / "file" / "report.json"), "x")
    assert [p.name for p in tmp_path.iterdir()] == ["file"]
