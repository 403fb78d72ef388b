from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .inproc import SimWorker


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private folder with a short path (a Unix socket path has at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="sf-edge-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sim(short_dir: Path) -> Iterator[SimWorker]:
    worker = SimWorker(short_dir).start()
    yield worker
    worker.stop()


@pytest.fixture
def slow_sim(short_dir: Path) -> Iterator[SimWorker]:
    """Two lanes, a few milliseconds a step: streams that are still running when looked at."""
    worker = SimWorker(short_dir, lanes=2, step_sleep_s=0.003).start()
    yield worker
    worker.stop()
