from __future__ import annotations

import pytest

from .server import RunningServer


@pytest.fixture(scope="session")
def server(shared_server: RunningServer) -> RunningServer:
    """The session's shared real server (tests/conftest.py)."""
    return shared_server
