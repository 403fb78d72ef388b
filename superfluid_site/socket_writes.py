"""The web process's socket writes: sent when they are made, not a loop turn later.

Twisted's TCP transport never writes in ``write()``: it appends the bytes to a buffer, asks the
reactor to watch the socket for writability (an ``epoll_ctl``), and sends them in ``doWrite`` on a
later turn of the loop, which then stops watching (another ``epoll_ctl``). A streamed token is one
write, so every token paid for two registrations and a loop turn, and reached the client a turn
late. :func:`install_immediate_writes` makes a plain TCP connection (no TLS) whose buffer is empty
send at once, as asyncio's own transports do; what the kernel does not take then (a client that
reads slowly, a full socket buffer) is buffered and sent by the reactor as before, so the order of
the bytes, the producer's back-pressure and a connection's loss behave as Twisted's own. A send
that fails leaves the bytes to the reactor too, whose ``doWrite`` meets the same error and loses
the connection the way it always has. ``serve`` installs it before daphne starts.
"""

from __future__ import annotations

from typing import Any


def _idle(conn: Any) -> bool:
    """Whether ``conn`` has nothing buffered and may take an immediate send: connected, not
    closing or aborted, not half-closed, and no TLS layer between it and the socket. Some of
    these are Twisted's private attributes: where one is missing (a Twisted that renamed it),
    every write takes Twisted's own buffered path."""
    try:
        return bool(
            conn.connected
            and not conn.disconnecting
            and not conn.disconnected
            and not conn._writeDisconnected
            and not conn._writeDisconnecting
            and not conn._aborting
            and not conn.TLS
            and not conn._tempDataBuffer
            and conn.offset == len(conn.dataBuffer)
        )
    except AttributeError:
        return False


def _send_now(conn: Any, data: bytes) -> bytes:
    """Send what the socket takes of ``data`` now; the rest (all of it after an error)."""
    try:
        sent = conn.socket.send(data)
    except OSError:  # a full socket (EAGAIN) or a lost one: the reactor's doWrite tries again
        return data
    return data[sent:]


def install_immediate_writes() -> None:
    """Make Twisted's TCP connections send a write at once when nothing is buffered before it."""
    from twisted.internet import tcp

    if getattr(tcp.Connection.write, "immediate", False):
        return

    buffered_write = tcp.Connection.write
    buffered_write_sequence = tcp.Connection.writeSequence

    def write(self: Any, data: bytes) -> None:
        if data and type(data) is bytes and _idle(self):
            data = _send_now(self, data)
            if not data:
                return
        buffered_write(self, data)

    def write_sequence(self: Any, iovec: Any) -> None:
        chunks = list(iovec)
        if all(type(chunk) is bytes for chunk in chunks):
            write(self, b"".join(chunks))  # one send, or Twisted's buffer: the same bytes in order
        else:
            buffered_write_sequence(self, chunks)  # Twisted's own TypeError

    write.immediate = write_sequence.immediate = True  # type: ignore[attr-defined]
    tcp.Connection.write = write  # type: ignore[method-assign]
    tcp.Connection.writeSequence = write_sequence  # type: ignore[method-assign]
