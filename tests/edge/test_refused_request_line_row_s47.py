"""A generation request whose request line Twisted refuses (its target not printable ASCII, as a
query string or path in raw UTF-8; a method or HTTP version it does not take; a line over its
length limit) gets its 400 with an ``X-Request-Id`` and leaves the activity row that id names,
as every other refused generation request does ("why did my request fail" is answered there).

Seen: ``POST /v1/chat/completions?q=é`` got a 400 and left no row: Twisted refuses such a line
before daphne sees it (daphne's own "Invalid query string" check comes after, and no longer
runs for it), so neither the channel nor a request held the path the row is named by; a line
over the limit got no ``X-Request-Id`` either."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from tests.edge.test_edge_refusal_request_id_s47 import reply_headers, row_ids
from tests.edge.test_request_bounds import BODY, TIMEOUT_S, connect, head, rows

pytestmark = pytest.mark.django_db(transaction=True)


@override_settings(SUPERFLUID_BODY_TIMEOUT=TIMEOUT_S)
@pytest.mark.parametrize(
    ("line", "endpoint"),
    [
        (b"POST /v1/chat/completions?q=caf\xc3\xa9 HTTP/1.1", "chat"),
        (b"POST /v1/completions/\xff HTTP/1.1", None),  # not a generation path: no row
        (b"POST /completion?\x7f HTTP/1.1", "completions"),
        (b"POST /infill HTTP/1.7", "infill"),
        (b"POST /v1/embeddings?q=" + b"a" * 20_000 + b" HTTP/1.1", "embeddings"),  # over Twisted's line limit
    ],
    ids=["utf-8 query", "utf-8 path elsewhere", "control byte", "bad version", "line too long"],
)
async def test_a_refused_request_line_leaves_the_row_its_reply_id_names(json_protocol_errors: Any, line: bytes, endpoint: str | None) -> None:
    server, protocol, transport, clock = connect()
    protocol.dataReceived(line + head(len(BODY)).partition(b"\r\n")[2] + BODY)
    clock.advance(TIMEOUT_S + 1)  # no 408 after it
    raw = transport.value()
    assert raw.startswith(b"HTTP/1.1 400") and raw.count(b"HTTP/1.1") == 1 and server.scopes == [], raw[:200]
    request_id = reply_headers(raw).get("x-request-id")
    assert request_id
    if endpoint is None:
        assert await rows() == []
    else:
        assert await rows() == [(endpoint, 400, "bad_request")]
        assert await row_ids() == [request_id]


@override_settings(SUPERFLUID_BODY_TIMEOUT=TIMEOUT_S)
@pytest.mark.parametrize(
    ("sent", "endpoint"),
    [(b"POST /v1/chat/completions HTTP/1.", "chat"), (b"POST /v1/chat/compl", None), (b"PO", None)],
    ids=["its path whole", "its path cut", "no path"],
)
async def test_a_request_line_not_whole_in_time_gets_an_id_and_the_row_its_path_names(sent: bytes, endpoint: str | None) -> None:
    """The 408 for a request line that never came whole (a client that stalls in it, a byte at a
    time) had no ``X-Request-Id``, and a generation request no row, though its path had come."""
    server, protocol, transport, clock = connect()
    protocol.dataReceived(sent)
    clock.advance(TIMEOUT_S)
    raw = transport.value()
    assert raw.startswith(b"HTTP/1.1 408") and server.scopes == [], raw[:200]
    request_id = reply_headers(raw).get("x-request-id")
    assert request_id
    assert await rows() == ([(endpoint, 408, "request_timeout")] if endpoint else [])
    if endpoint:
        assert await row_ids() == [request_id]
