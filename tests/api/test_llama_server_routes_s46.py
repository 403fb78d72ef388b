"""llama-server's native routes (/health, /props, ...) as its clients read them, in-process
(tests/edge/inproc.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.edge.inproc import request


@pytest.mark.parametrize(
    ("link", "status", "message"),
    [
        (SimpleNamespace(draining=False, connected=False), "loading", "Loading model"),
        (SimpleNamespace(draining=True, connected=True), "draining", "Server is shutting down"),
    ],
)
async def test_health_while_not_ready_is_a_503_with_llama_servers_error_object(
    monkeypatch: pytest.MonkeyPatch, link: SimpleNamespace, status: str, message: str
) -> None:
    """llama-server answers /health 503 ``{"error": {"code": 503, "message": "Loading model",
    "type": "unavailable_error"}}`` while it loads; this was ``{"status": "loading"}`` alone, so
    a client of llama-server reading ``error.message`` (as every other 503 here has it) found
    none. The ``status`` this API documents stays beside it."""
    from api import views

    monkeypatch.setattr(views, "get_pool", lambda: None)
    monkeypatch.setattr(views, "get_link", lambda: link)
    reply = await request("GET", "/health")
    assert reply.status == 503 and reply.is_error_object(), reply.body
    body = reply.json()
    assert body["status"] == status
    assert body["error"]["type"] == "unavailable_error" and body["error"]["code"] == 503
    assert body["error"]["message"] == message
