from __future__ import annotations

from collections.abc import Iterator

import pytest

from .server import RunningServer, serving


@pytest.fixture(scope="session")
def server() -> Iterator[RunningServer]:
    """One real server for the read-mostly tests; tests that kill or drain start their own."""
    with serving("--max-batch", "8", "--ctx-size", "2048") as srv:
        yield srv
