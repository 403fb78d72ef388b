"""Anthropic's routes (/v1/messages, /v1/messages/count_tokens) refused by the protocol layer
(api/edge.py: a Content-Length over --max-body-bytes, a body too slow): the refusal is
Anthropic's error object, as the route's own errors are, and a /v1/messages one leaves its
activity row as a chat's (driven as tests/edge/test_request_bounds.py drives daphne)."""

from __future__ import annotations

import pytest
from django.test import override_settings

from .test_request_bounds import TIMEOUT_S, connect, head, let_go, reply, rows

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("path", [b"/v1/messages", b"/v1/messages?beta=true", b"/v1/messages/count_tokens"])
async def test_a_content_length_over_the_bound_is_an_anthropic_413(path: bytes) -> None:
    server, protocol, transport, clock = connect()
    protocol.dataReceived(head(10**12, path))
    status, body = reply(transport)
    assert status == 413 and body["type"] == "error" and body["error"]["type"] == "request_too_large", body
    assert body["request_id"] and server.scopes == [] and let_go(transport, clock)
    assert await rows() == ([("chat", 413, "request_too_large")] if path.startswith(b"/v1/messages?") or path == b"/v1/messages" else [])


@override_settings(SUPERFLUID_BODY_TIMEOUT=TIMEOUT_S)
async def test_a_body_too_slow_is_an_anthropic_408() -> None:
    server, protocol, transport, clock = connect()
    protocol.dataReceived(head(100, b"/v1/messages"))
    clock.advance(TIMEOUT_S + 1)
    status, body = reply(transport)
    assert status == 408 and body["error"]["type"] == "timeout_error" and server.scopes == []


async def test_the_chat_route_keeps_the_openai_shape() -> None:
    _, protocol, transport, _ = connect()
    protocol.dataReceived(head(10**12))
    status, body = reply(transport)
    assert status == 413 and body["error"]["code"] == "request_too_large" and "type" not in body
