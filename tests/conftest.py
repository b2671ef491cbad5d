"""Fixtures shared by the tests."""

from __future__ import annotations

import logging
import os

import pytest

os.environ.setdefault("JITFLOPS_CALIBRATION_BUDGET_S", "6")
"""The suite's calibrations (``jitflops calibrate`` in the docs' blocks, the command line's test, the
GPU check's flow on a CPU) check the flow, not the figures: a 6 s budget, not the default 40 s."""


@pytest.fixture
def jitflops_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="jitflops")
    return caplog
