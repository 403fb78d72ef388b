"""The web process's socket writes (superfluid_site/socket_writes.py): a write on a connection with
nothing buffered is sent at once; what the socket does not take is left to the reactor, in order.

Each test runs Twisted's own TCP connection class over a real socket pair. Its reactor is a
recorder (which descriptors it was asked to watch for writability): the tests play the reactor's
part by calling ``doWrite`` when the peer has read, as the real one does when epoll says so.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from superfluid_site.socket_writes import install_immediate_writes


class RecordingReactor:
    """The part of a reactor a TCP connection calls while it writes and closes."""

    def __init__(self) -> None:
        self.writers: set[Any] = set()
        self.later: list[tuple[Any, tuple[Any, ...]]] = []

    def addWriter(self, fd: Any) -> None:  # noqa: N802 (Twisted's names)
        self.writers.add(fd)

    def removeWriter(self, fd: Any) -> None:  # noqa: N802
        self.writers.discard(fd)

    def addReader(self, fd: Any) -> None:  # noqa: N802
        pass

    def removeReader(self, fd: Any) -> None:  # noqa: N802
        pass

    def callLater(self, delay: float, f: Any, *args: Any) -> None:  # noqa: N802
        self.later.append((f, args))


class Protocol:
    def __init__(self) -> None:
        self.lost: list[Any] = []

    def connectionLost(self, reason: Any) -> None:  # noqa: N802
        self.lost.append(reason)


@pytest.fixture(scope="module", autouse=True)
def immediate() -> Iterator[None]:
    """install_immediate_writes for this module's tests, Twisted's own methods back after them."""
    from twisted.internet import tcp

    saved = tcp.Connection.write, tcp.Connection.writeSequence
    install_immediate_writes()
    try:
        yield
    finally:
        tcp.Connection.write, tcp.Connection.writeSequence = saved  # type: ignore[method-assign]


_open: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_sockets() -> Iterator[None]:
    yield
    while _open:
        _open.pop().close()


def connection(sndbuf: int | None = None) -> tuple[Any, socket.socket, RecordingReactor]:
    """(a connected Twisted TCP connection, the peer's socket, its reactor); both sockets are
    closed at the test's end."""
    from twisted.internet import tcp

    ours, peer = socket.socketpair()
    _open.extend((ours, peer))
    if sndbuf is not None:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sndbuf)
    peer.setblocking(False)
    reactor = RecordingReactor()
    conn = tcp.Connection(ours, Protocol(), reactor)  # type: ignore[arg-type]
    conn.connected = 1  # as tcp.Server sets it for an accepted connection
    return conn, peer, reactor


def drain(peer: socket.socket) -> bytes:
    """What the peer can read now, without waiting."""
    out = b""
    while True:
        try:
            chunk = peer.recv(1 << 20)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


def run_reactor(conn: Any, peer: socket.socket, reactor: RecordingReactor) -> bytes:
    """The reactor's part until nothing is buffered: the peer reads, the connection writes."""
    received = drain(peer)
    while conn in reactor.writers:
        assert conn.doWrite() is None
        received += drain(peer)
    return received + drain(peer)


def test_a_write_on_an_idle_connection_reaches_the_peer_before_the_reactor_turns() -> None:
    conn, peer, reactor = connection()
    conn.write(b'data: {"text": " the"}\n\n')
    assert drain(peer) == b'data: {"text": " the"}\n\n'
    assert not reactor.writers  # no registration, no loop turn, nothing left to send
    conn.writeSequence([b"1a\r\n", b"data: x\n\n", b"\r\n"])
    assert drain(peer) == b"1a\r\ndata: x\n\n\r\n"
    assert not reactor.writers


def test_what_the_socket_does_not_take_is_buffered_and_goes_out_in_order() -> None:
    conn, peer, reactor = connection(sndbuf=4096)
    big = bytes(range(256)) * 4096  # 1 MiB: far more than the socket buffers hold
    conn.write(big)
    assert conn in reactor.writers  # the rest waits for the reactor
    conn.write(b"after")  # not sent ahead of what is buffered
    conn.writeSequence([b"and ", b"last"])
    assert run_reactor(conn, peer, reactor) == big + b"after" + b"and last"
    conn.write(b"idle again")
    assert drain(peer) == b"idle again"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["write", "sequence", "read"]),
            st.integers(min_value=0, max_value=200_000),
        ),
        max_size=20,
    )
)
def test_any_mix_of_writes_and_slow_reads_delivers_every_byte_in_order(steps: list[tuple[str, int]]) -> None:
    conn, peer, reactor = connection(sndbuf=8192)
    try:
        sent = b""
        received = b""
        for n, (op, size) in enumerate(steps):
            data = bytes([n % 251]) * size
            if op == "write":
                conn.write(data)
                sent += data
            elif op == "sequence":
                conn.writeSequence([data[: size // 2], b"", data[size // 2 :]])
                sent += data
            else:  # the client reads some (the reactor writes what fits meanwhile)
                received += drain(peer)
                if conn in reactor.writers:
                    conn.doWrite()
        received += run_reactor(conn, peer, reactor)
        assert received == sent
    finally:  # (one test function, many examples: their sockets closed as they end)
        while _open:
            _open.pop().close()


def test_a_write_after_the_client_left_is_left_to_the_reactor_which_loses_the_connection() -> None:
    from twisted.internet import main

    conn, peer, reactor = connection()
    peer.close()
    for _ in range(3):  # the first send may still succeed; the next ones fail (EPIPE, ECONNRESET)
        conn.write(b"data: token\n\n")  # never raises into the consumer that wrote
    assert conn in reactor.writers
    assert conn.doWrite() is main.CONNECTION_LOST  # the reactor's own path to connectionLost


def test_nothing_is_sent_on_an_aborted_connection() -> None:
    conn, peer, reactor = connection()
    conn.abortConnection()
    conn.write(b"data: late\n\n")
    conn.writeSequence([b"late", b"r"])
    assert drain(peer) == b""


def test_a_twisted_without_the_private_state_it_reads_keeps_its_own_buffered_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    from twisted.internet import tcp

    monkeypatch.delattr(tcp._AbortingMixin, "_aborting")  # as if a later Twisted named it otherwise
    conn, peer, reactor = connection()
    conn.write(b"data: x\n\n")
    assert drain(peer) == b""  # not sent at once: left to the reactor, as Twisted does
    assert run_reactor(conn, peer, reactor) == b"data: x\n\n"
