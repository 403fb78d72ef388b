"""The web side of the local link: one engine worker process over a private stream socket.

``manage.py serve`` makes a ``socketpair`` for each worker it starts: the worker inherits one end
(``runengine --link-fd``), the other is handed to this process through :data:`WORKER_SOCKETS`.
No filesystem path is involved, so no other user can take, pre-bind or connect to the link. A
worker started by hand listens on ``runengine --socket PATH`` instead (a 0600 socket in a
directory only its owner can write; the worker refuses peers of another uid and so does this
client).

If the worker dies, the connection drops and the jobs in flight are kept (see ``transport``):
once the supervisor has started a new worker, each is submitted again, continuing after the text
already delivered. Only if no worker comes back within ``reconnect_timeout_s`` do jobs end with
``engine_unavailable``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading

from .messages import MAX_LINE_BYTES, Hello, decode, decode_or_drop
from .peer import peer_uid
from .transport import SNAPSHOT_LISTENERS, JobHandle, Transport, cancel_task

__all__ = ["SNAPSHOT_LISTENERS", "JobHandle", "SocketTransport", "WORKER_SOCKETS", "peer_uid"]

log = logging.getLogger("superfluid.link")


class WorkerSockets:
    """The web end of the current worker's socketpair, handed from the supervisor's thread to the
    event loop's transport. Only the newest one counts: an older one belongs to a dead worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.active = False  # serve hands sockets over; no path is tried

    def put(self, sock: socket.socket) -> None:
        with self._lock:
            old, self._sock = self._sock, sock
            self.active = True
        if old is not None:
            old.close()

    def take(self) -> socket.socket | None:
        with self._lock:
            sock, self._sock = self._sock, None
            return sock


WORKER_SOCKETS = WorkerSockets()


class SocketTransport(Transport):
    def __init__(self, socket_path: str = "", *, sockets: WorkerSockets | None = None, reconnect_timeout_s: float = 120.0) -> None:
        super().__init__(reconnect_timeout_s=reconnect_timeout_s)
        self.socket_path = socket_path
        self.sockets = sockets
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="superfluid-link")

    async def stop(self) -> None:
        await cancel_task(self._task)
        self._task = None

    async def _send(self, data: bytes) -> None:
        writer = self._writer
        if writer is None:
            return
        try:
            writer.write(data)
            await writer.drain()
        except (ConnectionError, OSError):
            pass  # the reader notices the loss and resubmits

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        if self.sockets is not None:
            sock = self.sockets.take()
            if sock is None:
                return None
            return await asyncio.open_unix_connection(sock=sock, limit=MAX_LINE_BYTES)
        try:
            reader, writer = await asyncio.open_unix_connection(self.socket_path, limit=MAX_LINE_BYTES)
        except OSError:
            return None
        sock = writer.get_extra_info("socket")
        if sock is not None and peer_uid(sock) != os.getuid():
            log.error("refusing the link at %s: it is held by another user", self.socket_path)
            writer.close()
            return None
        return reader, writer

    async def _hello_line(self, reader: asyncio.StreamReader) -> bytes:
        """The worker's first line. serve hands over a new worker's socket as it starts the
        process, so this waits out the model's load: no worker is back meanwhile, and the jobs
        kept for one still end once ``reconnect_timeout_s`` has passed."""
        loop = asyncio.get_running_loop()
        read = asyncio.ensure_future(reader.readline())
        try:
            while not (await asyncio.wait({read}, timeout=0.1))[0]:
                self._check_lost_deadline(loop.time())
            return read.result()
        finally:
            read.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            opened = await self._open()
            if opened is None:
                self._check_lost_deadline(loop.time())
                await asyncio.sleep(0.1)
                continue
            reader, writer = opened
            try:
                line = await self._hello_line(reader)
                hello = decode(line) if line else None
                if not isinstance(hello, Hello):
                    raise ConnectionError("worker did not say hello")
                self._writer = writer
                await self._on_hello(hello)
                while True:
                    line = await reader.readline()
                    if not line:
                        break
                    message = decode_or_drop(line, "the worker")
                    if message is not None:
                        job_id = getattr(message, "id", None)  # a string where there is one (messages.decode)
                        self._apply_from_worker(message, self.inflight.get(job_id) if job_id is not None else None)
            except (ConnectionError, OSError, ValueError) as exc:
                log.warning("link to the engine worker lost: %s", exc)
            finally:
                self._writer = None
                writer.close()
            self._on_lost(loop.time())


# Kept for callers that name the class: the local socket transport is "the link client".
LinkClient = SocketTransport

