from __future__ import annotations

from collections.abc import Iterator

import pytest

from .server import RunningServer


@pytest.fixture(scope="session")
def server() -> Iterator[RunningServer]:
    """One real server for the read-mostly tests; tests that kill or drain start their own."""
    srv = RunningServer("--max-batch", "8", "--ctx-size", "2048").start()
    try:
        yield srv
    finally:
        srv.stop()
