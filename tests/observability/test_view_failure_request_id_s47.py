"""A bug in one of the API's Django views (/tokenize, /props, /slots, the Batch API's routes)
answers a 500 that carries ``X-Request-Id``, and the traceback serve's console prints names the
same id, so an operator can find the log lines of the failure a client reports.

Seen: the 500 error object came back with no ``X-Request-Id`` (the consumers' replies carry one,
Django's views' none), and the log's "Internal Server Error: /tokenize" named no request, so a
client's report of the failure could not be matched to its traceback among the others."""

from __future__ import annotations

from typing import Any

import pytest

from tests.edge.inproc import JSON, SimWorker, attached, request
from tests.observability.test_view_failure_logged_s46 import console_output

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_view_500_carries_a_request_id_the_logged_traceback_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from api import views

    async def broken(model: Any = None) -> Any:
        raise RuntimeError("a bug in the view, s47")

    monkeypatch.setattr(views, "_vocab", broken)
    async with attached(SimWorker()):
        with console_output("django.request", "django", "superfluid.api") as out:
            first = await request("POST", "/tokenize", b'{"content": "hi"}', JSON)
            second = await request("POST", "/tokenize", b'{"content": "hi"}', JSON)
    for reply in (first, second):
        assert reply.status == 500 and reply.is_error_object() and reply.json()["error"]["type"] == "server_error"
        assert reply.headers.get("x-request-id"), reply.headers
    assert first.headers["x-request-id"] != second.headers["x-request-id"]
    err = out.getvalue()
    assert err.count("RuntimeError: a bug in the view, s47") == 2, err
    # each traceback is preceded by the line naming its request's id
    first_at, second_at = err.index(first.headers["x-request-id"]), err.index(second.headers["x-request-id"])
    assert first_at < err.index("Traceback") < second_at, err


async def test_every_reply_django_answers_under_the_api_carries_a_request_id() -> None:
    """As every reply of the consumers' routes does (docs/api.md): a 200, a 404, a 405."""
    async with attached(SimWorker()):
        replies = [
            await request("GET", "/v1/models"),
            await request("GET", "/v1/no-such-route"),
            await request("DELETE", "/tokenize"),
        ]
    assert [r.status for r in replies] == [200, 404, 405]
    ids = [r.headers.get("x-request-id") for r in replies]
    assert all(ids) and len(set(ids)) == 3, ids
