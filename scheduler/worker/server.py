"""The worker's end of the local link: reader threads feed an inbox; the tick thread sends.

Two ways in, neither a path another user can take:

- an inherited socket (``runengine --link-fd N``: one end of the ``socketpair`` serve made for
  this worker). It is the only connection there will ever be: when it closes, the web side is
  gone and the worker drains.
- ``runengine --socket PATH``: a listening socket created 0600, in a directory that neither its
  group nor others may write, and every peer's uid checked (SO_PEERCRED): another user's
  connection is closed before it is greeted.

Only the tick thread sends, so writes need no lock; readers never touch scheduler state. A
reader may set ``interrupt`` (through ``on_message``) so that a tick in flight stops at the
engine's next step (a cancel, or an urgent job arriving).
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import socket
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from scheduler.link.messages import MAX_LINE_BYTES, UNENCODABLE, EncodeError, Error, Hello, Message, decode, encode
from scheduler.link.peer import peer_uid

log = logging.getLogger("superfluid.worker")


@dataclass(frozen=True)
class Disconnected(Message):
    """Not on the wire: a note to the tick thread that a connection closed. ``link``: a whole
    link to a web side dropped (a socket, all its jobs: the web side submits each again on its
    next connection); else one Redis run of one job ended (fenced, lost, given to another pick),
    which may be its client's cancel."""

    type: ClassVar[str] = "disconnected"
    link: bool = True


DISCONNECTED = Disconnected(link=True)
RUN_ENDED = Disconnected(link=False)


def encode_or_error(message: Message) -> bytes:
    """The message's line; if it cannot be encoded, an ``Error(unencodable)`` for its job instead
    (a message without a job is dropped), so one job's bad text fails that job alone."""
    try:
        return encode(message)
    except EncodeError as exc:
        job_id = getattr(message, "id", None)
        log.error("cannot send %s: %s", message.type, exc)
        return encode(Error(job_id, UNENCODABLE, "The response could not be encoded.")) if job_id else b""


@dataclass(eq=False)
class Connection:
    conn_id: int
    sock: socket.socket | None
    alive: bool = True
    outbox: list[bytes] = field(default_factory=list)

    def queue(self, message: Message) -> None:
        self.outbox.append(encode_or_error(message))

    def flush(self) -> None:
        if not self.outbox:
            return
        data, self.outbox = b"".join(self.outbox), []
        if not self.alive or self.sock is None:
            return
        try:
            self.sock.sendall(data)
        except OSError:
            self.alive = False


def check_private_dir(path: str) -> None:
    """``ValueError`` unless the socket's directory is writable by its owner alone (else another
    user could take the name before the worker binds it, or swap it after)."""
    directory = os.path.dirname(os.path.abspath(path))
    st = os.stat(directory)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or st.st_uid != os.getuid():
        raise ValueError(f"the link socket's directory {directory} must belong to this user and be writable by no one else")


def check_not_listening(path: str) -> None:
    """``ValueError`` if a live process listens on the socket ``path`` (another engine worker:
    binding would take its name from under it, leaving two workers and serve talking to one);
    a stale socket file, which refuses connections, is left for :meth:`LinkServer.start` to
    replace. ``ValueError`` too if ``path`` is something else than a socket (a regular file: a
    typo'd path, the database), which binding would have deleted."""
    if not os.path.exists(path):
        return
    if not stat.S_ISSOCK(os.stat(path).st_mode):
        raise ValueError(f"{path} exists and is not a socket: give the link socket a path of its own")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError:  # refused (nobody listens: a stale file), or not a socket
        return
    finally:
        probe.close()
    raise ValueError(f"another process is already listening on {path}")


class LinkServer:
    def __init__(
        self,
        inbox: queue.SimpleQueue[tuple[Connection, Message]],
        on_message: Callable[[Message], None] = lambda m: None,
        hello: Callable[[], Hello] | None = None,
        *,
        path: str = "",
        inherited: socket.socket | None = None,
        on_closed: Callable[[], None] = lambda: None,
    ) -> None:
        self.path = path
        self.inherited = inherited
        self.inbox = inbox
        self.on_message = on_message
        self.hello = hello or (lambda: Hello("", "", 0, 0, os.getpid()))
        self.on_closed = on_closed
        self.connections: list[Connection] = []
        self._ids = itertools.count(1)
        self._sock: socket.socket | None = None

    def start(self) -> None:
        if self.inherited is not None:
            self._greet(self.inherited, last=True)
            return
        check_private_dir(self.path)
        check_not_listening(self.path)
        if os.path.exists(self.path):
            os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(self.path)
        finally:
            os.umask(old)
        sock.listen(16)
        self._sock = sock
        threading.Thread(target=self._accept_loop, name="link-accept", daemon=True).start()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        for conn in self.connections:
            conn.alive = False
            try:
                if conn.sock is not None:
                    conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def broadcast(self, message: Message) -> None:
        data = encode_or_error(message)
        for conn in self.connections:
            conn.outbox.append(data)

    def flush(self) -> None:
        for conn in self.connections:
            conn.flush()
        self.connections = [c for c in self.connections if c.alive or c.outbox]

    def _accept_loop(self) -> None:
        sock = self._sock
        while sock is not None:
            try:
                client, _ = sock.accept()
            except OSError:
                return
            try:
                uid = peer_uid(client)
            except OSError:
                uid = -1
            if uid != os.getuid():
                log.warning("refused a link connection from uid %s", uid)
                client.close()
                continue
            self._greet(client)

    def _greet(self, client: socket.socket, last: bool = False) -> None:
        conn = Connection(next(self._ids), client)
        try:
            client.sendall(encode(self.hello()))
        except OSError:
            client.close()
            if last:
                self.on_closed()
            return
        self.connections.append(conn)
        threading.Thread(target=self._read_loop, args=(conn, last), name=f"link-read-{conn.conn_id}", daemon=True).start()

    def _read_loop(self, conn: Connection, last: bool) -> None:
        assert conn.sock is not None
        reader = conn.sock.makefile("rb")
        try:
            while True:
                line = reader.readline(MAX_LINE_BYTES)
                if not line:
                    break
                try:
                    message = decode(line)
                except ValueError as exc:
                    log.warning("dropping a malformed link message from connection %s: %s", conn.conn_id, exc)
                    continue
                self.on_message(message)
                self.inbox.put((conn, message))
        except OSError:
            pass
        finally:
            conn.alive = False
            reader.close()
            conn.sock.close()
            self.inbox.put((conn, DISCONNECTED))
            if last:
                self.on_closed()
