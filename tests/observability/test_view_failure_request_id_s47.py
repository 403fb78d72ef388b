"""Every reply a Django view answers carries ``X-Request-Id``, as the consumers' do: a 200, a
404, a 405, and a view's 500, whose logged traceback names the same id
(tests/observability/test_view_failure_logged_s46.py), so an operator finds the log lines of a
failure a client reports. Seen: Django's replies carried none."""

from __future__ import annotations

import pytest

from tests.edge.inproc import SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)


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
