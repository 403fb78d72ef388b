"""A slow or oversized request against the real server (daphne and Twisted, not a test double):
it is refused with an OpenAI error object and the connection let go, nothing is queued, the
activity log says why, and everyone else keeps being served."""

from __future__ import annotations

import json
import socket
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from .server import RunningServer

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"
BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).encode()


def head(port: int, length: int) -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a socket timeout, far beyond
    the bound, is the failsafe: a server that never answers fails the test, it does not hang it)."""
    sock.settimeout(120)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def status_and_error(raw: bytes) -> tuple[int, dict]:
    status_line, _, rest = raw.partition(b"\r\n")
    headers, _, payload = rest.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in headers.lower()
    return int(status_line.split()[1]), json.loads(payload)["error"]


def activity_rows(server: RunningServer) -> list[tuple[str, int, str, str]]:
    """(endpoint, status, error code, client address) of each row."""
    with sqlite3.connect(Path(server.data_dir) / "superfluid.sqlite3") as db:
        return db.execute("SELECT endpoint, status, error_code, client_ip FROM activity_activityentry ORDER BY id").fetchall()


@pytest.fixture
def bounded(shared_server: RunningServer) -> RunningServer:
    """The session's shared server: its flags include --body-timeout 3 --max-body-bytes 100000
    (tests/conftest.py), bounds these tests reach on purpose and no other test comes near."""
    assert "--body-timeout" in shared_server.flags and "--max-body-bytes" in shared_server.flags
    return shared_server


def test_a_body_that_stops_halfway_is_refused_with_408_and_the_connection_let_go(bounded: RunningServer) -> None:
    slow = socket.create_connection(("127.0.0.1", bounded.port))
    try:
        slow.sendall(head(bounded.port, len(BODY)) + BODY[:10])  # and then nothing more
        # meanwhile a normal request is served, on its own connection
        ok = httpx.post(bounded.base + "/v1/chat/completions", content=BODY, headers={"content-type": "application/json"}, timeout=120)
        assert ok.status_code == 200, ok.text
        status, error = status_and_error(read_all(slow))
    finally:
        slow.close()
    assert status == 408 and error["code"] == "request_timeout" and error["type"] == "invalid_request_error"
    assert bounded.state()["lanes_active"] == 0
    bounded.wait_for(lambda: ("chat", 408, "request_timeout", "127.0.0.1") in activity_rows(bounded), timeout_s=30)
    assert "error=request_timeout" in bounded.log()


def test_a_content_length_over_the_bound_is_413_without_sending_the_body(bounded: RunningServer) -> None:
    with socket.create_connection(("127.0.0.1", bounded.port)) as big:
        big.sendall(head(bounded.port, 10**9))  # a gigabyte announced, none of it sent
        status, error = status_and_error(read_all(big))
    assert status == 413 and error["code"] == "request_too_large"
    bounded.wait_for(lambda: ("chat", 413, "request_too_large", "127.0.0.1") in activity_rows(bounded), timeout_s=30)
    ok = httpx.post(bounded.base + "/v1/chat/completions", content=BODY, headers={"content-type": "application/json"}, timeout=120)
    assert ok.status_code == 200, ok.text


def test_a_client_that_sends_its_whole_oversized_body_before_reading_still_gets_the_413(bounded: RunningServer) -> None:
    # httpx writes the whole body before it reads: the refusal comes while it is still writing
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 1_000_000}]}).encode()
    for _ in range(3):
        big = httpx.post(bounded.base + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=120)
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"


def test_a_request_line_trickled_a_byte_at_a_time_is_refused_with_408_and_the_connection_let_go(bounded: RunningServer) -> None:
    """Twisted makes a request object only once its request line is whole, and the body
    deadline started there: a client sending its request line a byte every few seconds (up to
    16 KiB) held the connection for days, each byte resetting the idle timeout. The line is timed
    from its first byte now: the 408 comes before the line is whole (here 36 bytes, a byte every
    0.5 s, against --body-timeout 3)."""
    line = b"POST /v1/chat/completions HTTP/1.1\r\n"
    reply, sent = b"", 0
    with socket.create_connection(("127.0.0.1", bounded.port)) as slow:
        for byte in line:
            try:
                slow.sendall(bytes([byte]))
            except OSError:  # the server has let go
                break
            sent += 1
            time.sleep(0.5)
            slow.setblocking(False)
            try:
                reply = slow.recv(65536)
            except BlockingIOError:
                pass
            finally:
                slow.setblocking(True)
            if reply:
                break
        slow.settimeout(30)
        reply += read_all(slow)
    assert sent < len(line), "the whole line went out before any answer"
    status, error = status_and_error(reply)
    assert status == 408 and error["code"] == "request_timeout"
    ok = httpx.post(bounded.base + "/v1/chat/completions", content=BODY, headers={"content-type": "application/json"}, timeout=120)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize(
    ("request_head", "status", "code"),
    [
        # Python's int() refuses over 4,300 digits: Twisted's parser raised and the reactor
        # dropped the connection without an answer
        (lambda port: head(port, 0).replace(b"Content-Length: 0", b"Content-Length: " + b"9" * 5000), 413, "request_too_large"),
        # LineReceiver's own limit closed the connection without a word
        (lambda port: head(port, 0).replace(b"\r\n\r\n", b"\r\nX-Long: " + b"a" * 20_000 + b"\r\n\r\n"), 400, "bad_request"),
    ],
    ids=["content-length of 5000 digits", "a 20 KiB header line"],
)
def test_http_twisted_cannot_parse_gets_a_json_error_not_a_dropped_connection(bounded: RunningServer, request_head, status: int, code: str) -> None:  # type: ignore[no-untyped-def]
    with socket.create_connection(("127.0.0.1", bounded.port)) as sock:
        sock.sendall(request_head(bounded.port))
        got, error = status_and_error(read_all(sock))
    assert (got, error["code"]) == (status, code)
    ok = httpx.post(bounded.base + "/v1/chat/completions", content=BODY, headers={"content-type": "application/json"}, timeout=120)
    assert ok.status_code == 200, ok.text
