"""Bounds the protocol layer keeps before the application sees a request (api/edge.py,
``install_request_bounds``): a body that trickles in is cut off after ``--body-timeout`` with a
408, a body over ``--max-body-bytes`` gets a 413 before it is read; either way nothing reaches
the application (nothing is queued) and the activity log says why.

These drive daphne's real request object on Twisted's real HTTP channel, over an in-memory
transport with a test clock: no sockets, no waiting."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import override_settings
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from activity import writer as activity_writer
from activity.models import ActivityEntry
from api.edge import LINGER_S, install_request_bounds

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT_S = 30


class FakeServer:
    """What daphne's request object asks of its server; ``scopes`` are the requests handed to
    the application."""

    root_path = ""
    proxy_forwarded_address_header = None
    request_buffer_size = 8192
    server_name = "daphne"
    http_timeout = None

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []
        self.bodies: list[bytes] = []

    def protocol_connected(self, protocol: Any) -> None:
        pass

    def protocol_disconnected(self, protocol: Any) -> None:
        pass

    def log_action(self, *args: Any) -> None:
        pass

    def create_application(self, protocol: Any, scope: dict[str, Any]) -> Any:
        self.scopes.append(scope)
        bodies = self.bodies

        class Queue:
            @staticmethod
            def put_nowait(message: dict[str, Any]) -> None:
                bodies.append(message.get("body", b""))

        return Queue()


class HalfClosingTransport(StringTransport):
    """A TCP-like transport: the server may close its writing side and keep reading."""

    write_closed = False

    def loseWriteConnection(self) -> None:  # noqa: N802 - Twisted's name
        self.write_closed = True


def let_go(transport: HalfClosingTransport, clock: Clock) -> bool:
    """The answer is out and the server's side closed at once; the connection ends after the
    linger whatever the client does."""
    answered_and_half_closed = transport.write_closed and not transport.disconnecting
    clock.advance(LINGER_S)
    return answered_and_half_closed and transport.disconnecting


def connect() -> tuple[FakeServer, Any, HalfClosingTransport, Clock]:
    from daphne.http_protocol import HTTPFactory

    install_request_bounds()
    server, clock = FakeServer(), Clock()
    factory = HTTPFactory(server)
    factory.reactor = clock  # the channel's idle timeout and our deadline both run on it
    protocol = factory.buildProtocol(("127.0.0.1", 50000))
    transport = HalfClosingTransport(peerAddress=type("A", (), {"host": "127.0.0.1", "port": 50000})())
    protocol.makeConnection(transport)
    return server, protocol, transport, clock


def head(length: int | None, path: bytes = b"/v1/chat/completions") -> bytes:
    lines = [b"POST " + path + b" HTTP/1.1", b"Host: 127.0.0.1:8000", b"Content-Type: application/json"]
    lines.append(b"Content-Length: %d" % length if length is not None else b"Transfer-Encoding: chunked")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def reply(transport: StringTransport) -> tuple[int, dict[str, Any]]:
    raw = transport.value()
    status_line, _, rest = raw.partition(b"\r\n")
    _headers, _, payload = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(payload)


async def rows() -> list[tuple[str, int, str]]:
    import asyncio

    assert await asyncio.to_thread(activity_writer.flush)
    return await sync_to_async(list)(ActivityEntry.objects.values_list("endpoint", "status", "error_code"))


BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


@override_settings(SUPERFLUID_BODY_TIMEOUT=TIMEOUT_S)
@pytest.mark.parametrize("sent", [0, 1, len(BODY) - 1], ids=["no body", "one byte", "all but one byte"])
async def test_a_body_that_trickles_in_is_cut_off_with_a_408_and_never_queued(sent: int) -> None:
    server, protocol, transport, clock = connect()
    protocol.dataReceived(head(len(BODY)) + BODY[:sent])
    for _ in range(TIMEOUT_S - 1):  # a byte of the body each second (all but its last): no byte resets the deadline
        clock.advance(1)
        assert not transport.write_closed and transport.value() == b""
        if sent < len(BODY) - 1:
            protocol.dataReceived(BODY[sent : sent + 1])
            sent += 1
    clock.advance(1)
    status, body = reply(transport)
    assert status == 408 and body["error"]["code"] == "request_timeout" and body["error"]["type"] == "invalid_request_error"
    protocol.dataReceived(BODY[sent:])  # the rest, too late: dropped
    assert let_go(transport, clock)  # the connection (and its worker slot) is let go
    assert server.scopes == [] and server.bodies == []  # the application never saw it
    assert await rows() == [("chat", 408, "request_timeout")]
    # the row says how long it was open: the whole timeout (it said 0: it was timed at the 408)
    assert await sync_to_async(list)(ActivityEntry.objects.values_list("total_ms", flat=True)) == [TIMEOUT_S * 1000]


@override_settings(SUPERFLUID_BODY_TIMEOUT=TIMEOUT_S)
async def test_a_body_that_arrives_in_time_is_served_and_its_deadline_never_fires() -> None:
    server, protocol, transport, clock = connect()
    protocol.dataReceived(head(len(BODY)) + BODY[:5])
    clock.advance(TIMEOUT_S - 1)
    protocol.dataReceived(BODY[5:])
    assert len(server.scopes) == 1 and b"".join(server.bodies) == BODY
    clock.advance(10 * TIMEOUT_S)
    assert transport.value() == b"" and not transport.write_closed and not transport.disconnecting  # the application answers, not the edge
    assert await rows() == []


@override_settings(SUPERFLUID_BODY_TIMEOUT=TIMEOUT_S)
async def test_a_client_that_leaves_halfway_through_its_body_leaves_a_row_saying_so() -> None:
    """The application never sees such a request (daphne hands it over once its body is whole),
    so it left no trace at all: now its row says the client left, and after how long."""
    from twisted.internet.error import ConnectionDone
    from twisted.python.failure import Failure

    server, protocol, transport, clock = connect()
    protocol.dataReceived(head(len(BODY)) + BODY[:5])
    clock.advance(2)
    protocol.connectionLost(Failure(ConnectionDone()))
    assert server.scopes == []
    assert await rows() == [("chat", 499, "client_disconnected")]
    assert await sync_to_async(list)(ActivityEntry.objects.values_list("total_ms", flat=True)) == [2000]
    # one whose body arrived whole is the application's to record: nothing here
    server, protocol, transport, clock = connect()
    protocol.dataReceived(head(len(BODY)) + BODY)
    protocol.connectionLost(Failure(ConnectionDone()))
    assert len(server.scopes) == 1 and len(await rows()) == 1


@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000)
async def test_a_content_length_over_the_bound_is_413_before_any_body_is_read_and_logged() -> None:
    server, protocol, transport, clock = connect()
    protocol.dataReceived(head(10**12))
    status, body = reply(transport)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    protocol.dataReceived(b"x" * 5000)  # whatever the client sends anyway is dropped
    assert server.scopes == [] and let_go(transport, clock)
    assert await rows() == [("chat", 413, "request_too_large")]


@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000)
async def test_an_embeddings_body_over_the_bound_is_logged_as_embeddings_are() -> None:
    """docs/api.md: embeddings requests show in the activity log and metrics; one refused at the
    edge left no row."""
    server, protocol, transport, clock = connect()
    protocol.dataReceived(head(10**12, b"/v1/embeddings"))
    assert reply(transport)[0] == 413 and server.scopes == [] and let_go(transport, clock)
    assert await rows() == [("embeddings", 413, "request_too_large")]


@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000)
async def test_a_chunked_body_is_cut_off_at_the_bound() -> None:
    server, protocol, transport, clock = connect()
    protocol.dataReceived(head(None, b"/v1/completions"))
    for _ in range(3):
        protocol.dataReceived(b"190\r\n" + b"x" * 400 + b"\r\n")
    status, body = reply(transport)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    protocol.dataReceived(b"190\r\n" + b"x" * 400 + b"\r\n0\r\n\r\n")  # the rest, and its end: dropped
    assert server.scopes == [] and let_go(transport, clock)
    assert await rows() == [("completions", 413, "request_too_large")]


@override_settings(SUPERFLUID_BODY_TIMEOUT=TIMEOUT_S)
async def test_a_refusal_outside_the_generation_endpoints_is_json_but_leaves_no_activity_row() -> None:
    server, protocol, transport, clock = connect()
    protocol.dataReceived(head(10, b"/tokenize"))
    clock.advance(TIMEOUT_S)
    assert reply(transport)[0] == 408 and server.scopes == []
    assert await rows() == []


@pytest.mark.parametrize(("n", "status"), [(16, 413), (1, 200)])
async def test_choices_times_a_large_body_beyond_two_bodies_worth_is_413_before_anything_is_queued(n: int, status: int) -> None:
    """Each of n choices is a job carrying the whole request: 16 copies of a body near
    --max-body-bytes sent 200 MB over the link and held the event loop for seconds."""
    from .inproc import JSON, SimWorker, attached, chat_body, request

    sim = SimWorker()
    async with attached(sim) as (link, _rt):
        reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=1, n=n, user="u" * 1_100_000), JSON)
        assert reply.status == status, reply.body[:300]
        if status == 413:
            assert reply.json()["error"]["code"] == "request_too_large" and reply.json()["error"]["param"] == "n"
            assert link.worker is not None and link.worker.stats["requests_total"] == 0


# -- HTTP the parser chokes on: one JSON answer, nothing handed on, no second reply ----------------


def only_reply(transport: StringTransport) -> tuple[int, dict[str, Any]]:
    """The one response on the connection (a second one after it fails the test)."""
    status, body = reply(transport)
    assert transport.value().count(b"HTTP/1.1 ") == 1, transport.value()
    return status, body


@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000)
async def test_a_content_length_of_thousands_of_digits_is_413_not_a_dropped_connection() -> None:
    """Python's int() refuses a string of more than 4,300 digits: Twisted's parser raised, and
    the connection was dropped with no answer (a traceback in the log for each)."""
    server, protocol, transport, clock = connect()
    protocol.dataReceived(head(None).replace(b"Transfer-Encoding: chunked", b"Content-Length: " + b"9" * 5000))
    status, body = reply(transport)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert server.scopes == [] and let_go(transport, clock)
    assert await rows() == [("chat", 413, "request_too_large")]
    # leading zeros are still the length they spell: the application reads that length, not
    # 4,000 digits (which Django's middleware turned into a 500)
    server, protocol, transport, clock = connect()
    protocol.dataReceived(head(None).replace(b"Transfer-Encoding: chunked", b"Content-Length: " + b"0" * 5000 + b"%d" % len(BODY)) + BODY)
    assert len(server.scopes) == 1 and b"".join(server.bodies) == BODY
    assert dict(server.scopes[0]["headers"])[b"content-length"] == b"%d" % len(BODY)


@override_settings(SUPERFLUID_BODY_TIMEOUT=TIMEOUT_S)
@pytest.mark.parametrize("where", ["request line", "header"])
async def test_a_line_over_twisteds_limit_is_a_json_400_not_a_silent_close(json_protocol_errors: None, where: str) -> None:
    server, protocol, transport, clock = connect()
    long = b"a" * 20_000
    protocol.dataReceived(b"GET /v1/models?q=" + long + b" HTTP/1.1\r\n" if where == "request line" else head(len(BODY)).replace(b"\r\n\r\n", b"\r\nX-Long: " + long + b"\r\n\r\n"))
    clock.advance(TIMEOUT_S + 1)  # and no 408 after it
    status, body = only_reply(transport)
    assert status == 400 and body["error"]["code"] == "bad_request" and transport.disconnecting
    assert server.scopes == []
    assert await rows() == ([] if where == "request line" else [("chat", 400, "bad_request")])


@override_settings(SUPERFLUID_BODY_TIMEOUT=TIMEOUT_S)
@pytest.mark.parametrize(
    "rest",
    [b"zz\r\nhello\r\n", b"5\r\nhelloXX"],
    ids=["a chunk size that is not hex", "a chunk without its CRLF"],
)
async def test_a_body_whose_framing_is_bad_gets_one_400_and_its_row_says_so(json_protocol_errors: None, rest: bytes) -> None:
    """The 400 ends that request: its arrival deadline went on, and a client slow to read the
    400 got a 408 written after it, and a row saying request_timeout."""
    server, protocol, transport, clock = connect()
    protocol.dataReceived(head(None) + rest)
    clock.advance(TIMEOUT_S + 1)
    status, body = only_reply(transport)
    assert status == 400 and body["error"]["code"] == "bad_request"
    assert server.scopes == []
    assert await rows() == [("chat", 400, "bad_request")]


@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000)
@pytest.mark.parametrize("path", [b"//v1/chat/completions", b"/v1/chat/complet%69ons", b"/v1/chat/completions?x=1"])
async def test_a_refusal_of_a_generation_path_spelled_otherwise_is_logged_as_that_endpoint(path: bytes) -> None:
    """The consumers serve the path as routed (leading slashes as one, %-escapes decoded): a
    request the edge refused on such a spelling left no activity row and no count in /metrics."""
    server, protocol, transport, clock = connect()
    protocol.dataReceived(head(10**6, path))
    assert reply(transport)[0] == 413 and server.scopes == []
    assert await rows() == [("chat", 413, "request_too_large")]
