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


@pytest.fixture
def json_protocol_errors():  # type: ignore[no-untyped-def]
    """``serve``'s JSON answers for what Twisted and daphne cannot parse, for one test."""
    from daphne.http_protocol import WebRequest
    from twisted.web.http import HTTPChannel

    from api.edge import install_protocol_errors

    saved = WebRequest.basic_error, HTTPChannel._respondToBadRequestAndDisconnect, HTTPChannel.lineLengthExceeded
    install_protocol_errors()
    yield
    WebRequest.basic_error, HTTPChannel._respondToBadRequestAndDisconnect, HTTPChannel.lineLengthExceeded = saved
    del WebRequest._parsePOSTFormSubmission
