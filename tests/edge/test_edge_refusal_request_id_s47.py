"""A generation request the protocol layer refuses itself (a body over ``--max-body-bytes``, one
that trickles in past ``--body-timeout``, HTTP it cannot parse) gets an ``X-Request-Id``, and its
activity row holds the same id, as docs/api.md says of every error response ("for a request
refused before it had a job (a bad body, a limit, no engine), an id of its own; the request's
activity row holds the same id").

Seen: the 413 and 408 carried no ``X-Request-Id`` and their rows an empty request id, so a
client's report of the refusal matched no row."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import override_settings

from activity.models import ActivityEntry
from tests.edge.test_request_bounds import BODY, TIMEOUT_S, connect, head, rows

pytestmark = pytest.mark.django_db(transaction=True)


def reply_headers(raw: bytes) -> dict[str, str]:
    _status, _, rest = raw.partition(b"\r\n")
    lines = rest.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    return {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}


async def row_ids() -> list[str]:
    await rows()  # (flushed)
    return await sync_to_async(list)(ActivityEntry.objects.order_by("id").values_list("request_id", flat=True))  # type: ignore[arg-type]


@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000, SUPERFLUID_BODY_TIMEOUT=TIMEOUT_S)
async def test_edge_refusals_carry_the_request_id_their_rows_hold() -> None:
    ids: list[str] = []
    _server, protocol, transport, _clock = connect()
    protocol.dataReceived(head(10**12))  # 413 at its Content-Length
    ids.append(reply_headers(transport.value()).get("x-request-id", ""))
    _server, protocol, transport, clock = connect()
    protocol.dataReceived(head(len(BODY)) + BODY[:3])
    clock.advance(TIMEOUT_S)  # 408
    ids.append(reply_headers(transport.value()).get("x-request-id", ""))
    assert all(ids) and len(set(ids)) == 2, ids
    assert await row_ids() == ids


async def test_a_request_twisted_cannot_parse_carries_the_id_its_row_holds(json_protocol_errors: Any) -> None:
    _server, protocol, transport, _clock = connect()
    protocol.dataReceived(head(len(BODY)).replace(b"Content-Length: ", b"Content-Length: x"))
    raw = transport.value()
    assert raw.startswith(b"HTTP/1.1 400"), raw
    request_id = reply_headers(raw).get("x-request-id")
    assert request_id and await row_ids() == [request_id]


async def test_daphnes_own_refusal_carries_the_id_its_row_holds(json_protocol_errors: Any) -> None:
    """A query string that is not ASCII: refused 400 on its request line (Twisted's parser,
    before daphne's own check of it); its row holds the reply's id
    (tests/edge/test_refused_request_line_row_s47.py)."""
    server, protocol, transport, _clock = connect()
    protocol.dataReceived(head(len(BODY), b"/v1/chat/completions?q=\xff") + BODY)
    raw = transport.value()
    assert raw.startswith(b"HTTP/1.1 400") and server.scopes == [], raw
    request_id = reply_headers(raw).get("x-request-id")
    assert request_id and await row_ids() == [request_id]
