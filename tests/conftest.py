"""Fixtures shared by the tests."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture
def jitflops_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="jitflops")
    return caplog
