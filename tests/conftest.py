"""Fixtures shared by the tests."""

from __future__ import annotations

import logging
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
"""No test reaches the Hugging Face Hub (the machine has no network; a call that tried would wait
for its timeout): in every process of the suite, those it forks and starts too."""

os.environ.setdefault("JITFLOPS_CALIBRATION_BUDGET_S", "3")
"""The suite's calibrations (``jitflops calibrate`` in the docs' blocks, the command line's test, the
GPU check's flow on a CPU) check the flow, not the figures: a 3 s budget, not the default 40 s."""


if os.environ.get("PYTEST_XDIST_WORKER"):  # the suite on several processes (the README's -n 2)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
"""Under pytest-xdist each worker, and the processes it starts, computes on one thread: two workers
of two threads each on a 2-core machine spin on each other's cores (the op database's tests ran 16%
slower so)."""


@pytest.fixture
def jitflops_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="jitflops")
    return caplog
