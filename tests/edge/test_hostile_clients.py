"""What a hostile (or merely odd) client does at the protocol layer (api/edge.py) ends with that
client: one answer, a row in the activity log, and the connection let go when the edge says.

As tests/edge/test_request_bounds.py, these drive daphne's real request object on Twisted's real
HTTP channel over an in-memory transport with a test clock: no sockets, no waiting."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings
from twisted.internet.task import Clock

from api.edge import LINGER_S

from .test_request_bounds import BODY, TIMEOUT_S, FakeServer, HalfClosingTransport, head, reply, rows

pytestmark = pytest.mark.django_db(transaction=True)


class UnreadConnection(HalfClosingTransport):
    """A TCP connection whose client reads nothing (its window already full of earlier replies):
    as Twisted's TCP transport, ``loseConnection`` closes only once the client has read what was
    written, which never happens; ``abortConnection`` closes at once."""

    closed = False

    def loseConnection(self) -> None:  # noqa: N802 - Twisted's name
        self.disconnecting = True  # waiting to flush: still open

    def abortConnection(self) -> None:  # noqa: N802 - Twisted's name
        self.disconnecting = self.closed = True


def connect(transport: HalfClosingTransport | None = None) -> tuple[FakeServer, Any, HalfClosingTransport, Clock]:
    from daphne.http_protocol import HTTPFactory

    from api.edge import install_request_bounds

    install_request_bounds()
    server, clock = FakeServer(), Clock()
    factory = HTTPFactory(server)
    factory.reactor = clock
    protocol = factory.buildProtocol(("127.0.0.1", 50000))
    transport = transport or HalfClosingTransport()
    transport.peerAddr = type("A", (), {"host": "127.0.0.1", "port": 50000})()
    protocol.makeConnection(transport)
    return server, protocol, transport, clock


def with_header(raw_head: bytes, header: bytes) -> bytes:
    return raw_head.replace(b"\r\n\r\n", b"\r\n" + header + b"\r\n\r\n")


@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000)
async def test_a_body_refused_on_its_length_gets_no_100_continue_after_its_413() -> None:
    """Twisted answers ``Expect: 100-continue`` once the headers are in, after the length was
    judged: the 413 (Connection: close) went out, then ``HTTP/1.1 100 Continue`` behind it,
    inviting the body the server will never read."""
    server, protocol, transport, clock = connect()
    protocol.dataReceived(with_header(head(10**6), b"Expect: 100-continue"))
    assert transport.value().count(b"HTTP/1.1 ") == 1, transport.value()
    status, body = reply(transport)
    assert status == 413 and body["error"]["code"] == "request_too_large" and server.scopes == []
    # a body the server will read is still invited
    server, protocol, transport, clock = connect()
    protocol.dataReceived(with_header(head(len(BODY)), b"Expect: 100-continue"))
    assert transport.value() == b"HTTP/1.1 100 Continue\r\n\r\n"
    protocol.dataReceived(BODY)
    assert b"".join(server.bodies) == BODY


@pytest.mark.parametrize("header", [b"X-Odd: a\x0bb", b"X-Odd: a\x0cb", b"X-Odd: a\x85b"], ids=["vertical tab", "form feed", "NEL"])
async def test_a_header_byte_daphne_refuses_leaves_a_row_as_twisteds_own_400s_do(json_protocol_errors: None, header: bytes) -> None:
    """Twisted lets these bytes through and daphne answers 400 itself, before the application:
    the reply was JSON, but the request left no access-log line, no count in /metrics and no
    activity row (a NUL, which Twisted refuses, left all three)."""
    server, protocol, transport, clock = connect()
    protocol.dataReceived(with_header(head(len(BODY)), header) + BODY)
    raw = transport.value()
    assert raw.startswith(b"HTTP/1.1 400 ") and b'"code": "bad_request"' in raw
    assert server.scopes == []
    assert await rows() == [("chat", 400, "bad_request")]


@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000, SUPERFLUID_BODY_TIMEOUT=TIMEOUT_S)
@pytest.mark.parametrize("refusal", ["413", "408"])
async def test_a_refused_connection_whose_client_reads_nothing_is_let_go_after_the_linger(refusal: str) -> None:
    """The linger ended with ``loseConnection``, which waits for the client to read: a client that
    never reads, and ends its body after the refusal (which turns the channel's idle timeout off),
    held the connection and its unsent bytes for good."""
    server, protocol, transport, clock = connect(UnreadConnection())
    if refusal == "413":
        protocol.dataReceived(head(None) + b"3e8\r\n" + b"x" * 1000 + b"\r\n" + b"1\r\nx\r\n")
    else:
        protocol.dataReceived(head(len(BODY)) + BODY[:5])
        clock.advance(TIMEOUT_S)
    assert reply(transport)[0] == int(refusal) and transport.write_closed
    protocol.dataReceived(b"0\r\n\r\n" if refusal == "413" else BODY[5:])  # the body's end, dropped
    clock.advance(LINGER_S)
    assert transport.closed
    assert server.scopes == []


@pytest.mark.parametrize("root", [b"/elsewhere", b"/\xff"], ids=["a path the request is not under", "a byte that is not ASCII"])
async def test_a_daphne_root_path_header_from_a_client_does_not_turn_its_request_into_a_500(json_protocol_errors: None, root: bytes) -> None:
    """daphne takes ``Daphne-Root-Path`` from the request as the scope's ``root_path``: any client
    sending one that its path is not under had Channels' router raise (a 500 and an ERROR with a
    traceback in the log, at will); one not ASCII made daphne's own processing raise (a 500, its
    row ``server_error``). serve mounts the API at ``/`` and no proxy is told to send it: the
    request is the application's as if the header were not there."""
    server, protocol, transport, clock = connect()
    protocol.dataReceived(with_header(head(len(BODY)), b"Daphne-Root-Path: " + root) + BODY)
    assert transport.value() == b""  # no 500 from daphne
    assert [(s["root_path"], s["path"]) for s in server.scopes] == [("", "/v1/chat/completions")]
    assert b"daphne-root-path" not in dict(server.scopes[0]["headers"]) and b"".join(server.bodies) == BODY
    assert await rows() == []


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/nowhere"])
async def test_a_websocket_to_a_path_with_no_websocket_is_refused_not_a_crash_of_the_application(path: str) -> None:
    """Only the dashboard takes websockets: an upgrade anywhere else (from an allowed origin,
    which any client can name) had Channels' router raise ValueError, an ERROR with a traceback
    in the log for each, at any client's will. It is refused as a connection is refused: closed
    before it opens (daphne answers 403)."""
    from channels.testing import ApplicationCommunicator

    from .inproc import HOST, application

    scope = {
        "type": "websocket",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", HOST), (b"origin", b"http://" + HOST)],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "subprotocols": [],
    }
    comm = ApplicationCommunicator(application(), scope)
    await comm.send_input({"type": "websocket.connect"})
    assert (await comm.receive_output(5))["type"] == "websocket.close"
    await comm.send_input({"type": "websocket.disconnect", "code": 1006})
    await comm.wait(5)  # and the application ends without an exception
