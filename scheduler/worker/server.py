"""The worker's end of the link: a Unix-socket server whose reader threads feed an inbox.

Only the tick thread sends, so writes need no lock; readers never touch scheduler state. A
reader may set ``interrupt`` so that a tick in flight stops at the engine's next step (a cancel,
or an urgent job arriving).
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scheduler.link.protocol import MAX_LINE_BYTES, decode, encode

log = logging.getLogger("superfluid.worker")


@dataclass(eq=False)
class Connection:
    conn_id: int
    sock: socket.socket
    alive: bool = True
    outbox: list[bytes] = field(default_factory=list)

    def queue(self, message: dict[str, Any]) -> None:
        self.outbox.append(encode(message))

    def flush(self) -> None:
        if not self.outbox:
            return
        data, self.outbox = b"".join(self.outbox), []
        if not self.alive:
            return
        try:
            self.sock.sendall(data)
        except OSError:
            self.alive = False


class LinkServer:
    def __init__(
        self,
        path: str,
        inbox: queue.SimpleQueue[tuple[Connection, dict[str, Any]]],
        on_message: Callable[[dict[str, Any]], None] = lambda m: None,
        hello: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        self.path = path
        self.inbox = inbox
        self.on_message = on_message
        self.hello = hello
        self.connections: list[Connection] = []
        self._ids = itertools.count(1)
        self._sock: socket.socket | None = None

    def start(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        sock.listen(16)
        self._sock = sock
        threading.Thread(target=self._accept_loop, name="link-accept", daemon=True).start()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for conn in self.connections:
            conn.alive = False
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def broadcast(self, message: dict[str, Any]) -> None:
        data = encode(message)
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
            conn = Connection(next(self._ids), client)
            try:
                client.sendall(encode({"ev": "hello", **self.hello()}))
            except OSError:
                client.close()
                continue
            self.connections.append(conn)
            threading.Thread(target=self._read_loop, args=(conn,), name=f"link-read-{conn.conn_id}", daemon=True).start()

    def _read_loop(self, conn: Connection) -> None:
        reader = conn.sock.makefile("rb")
        try:
            while True:
                line = reader.readline(MAX_LINE_BYTES)
                if not line:
                    break
                try:
                    message = decode(line)
                except ValueError:
                    log.warning("dropping a malformed link message from connection %s", conn.conn_id)
                    continue
                self.on_message(message)
                self.inbox.put((conn, message))
        except OSError:
            pass
        finally:
            conn.alive = False
            self.inbox.put((conn, {"op": "disconnected"}))
