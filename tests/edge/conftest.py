from __future__ import annotations

import pytest

from .inproc import SimWorker


@pytest.fixture
def sim() -> SimWorker:
    return SimWorker()


@pytest.fixture
def slow_sim() -> SimWorker:
    """Two lanes, a few milliseconds a step: streams that are still running when looked at."""
    return SimWorker(lanes=2, step_sleep_s=0.003)
