"""The in-process transport: the engine worker's loop on a thread of this process.

Messages take the same encode/decode path as on the socket, so what cannot travel fails the
same way. A worker that dies (an exception out of its loop: the simulated "crash") is replaced
by a fresh one from ``make_worker``, as ``serve``'s supervisor replaces a worker process: the
jobs it had are submitted again, and a job in flight during two losses in a row fails.
Fast tests use it with the simulated engine (``scheduler.engines.sim``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .messages import Message, decode
from .transport import Transport

if TYPE_CHECKING:
    from scheduler.worker.loop import EngineWorker
    from scheduler.worker.server import Connection

log = logging.getLogger("superfluid.link")


class _WorkerLink:
    """What the worker loop sends through (``worker.link``): its outbox goes to the event loop."""

    def __init__(self, transport: InProcessTransport, conn: Connection, generation: int) -> None:
        self.transport, self.conn, self.generation = transport, conn, generation
        self.connections = [conn]

    def start(self) -> None:
        pass

    def close(self) -> None:
        self.conn.alive = False

    def broadcast(self, message: Message) -> None:
        self.conn.queue(message)

    def flush(self) -> None:
        data, self.conn.outbox = b"".join(self.conn.outbox), []
        if data and self.conn.alive:
            self.transport._from_worker(self.generation, data)


class InProcessTransport(Transport):
    def __init__(self, make_worker: Callable[[], EngineWorker], *, drain_timeout_s: float = 30.0, restart_delay_s: float = 0.0, reconnect_timeout_s: float = 120.0) -> None:
        super().__init__(reconnect_timeout_s=reconnect_timeout_s)
        self.make_worker = make_worker
        self.drain_timeout_s = drain_timeout_s
        self.restart_delay_s = restart_delay_s
        self.worker: EngineWorker | None = None
        self.restarts = 0
        self._generation = 0
        self._conn: Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self.exited = asyncio.Event()

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._spawn()

    def _spawn(self) -> None:
        from scheduler.worker.server import Connection

        assert self._loop is not None
        self._generation += 1
        generation = self._generation
        worker = self.make_worker()
        conn = Connection(generation, None)
        worker.link = _WorkerLink(self, conn, generation)  # type: ignore[assignment]
        self.worker, self._conn = worker, conn
        hello = worker.hello()
        loop = self._loop

        def run() -> None:
            try:
                worker.run(self.drain_timeout_s)
            except BaseException:
                log.exception("in-process engine worker died")
            finally:
                conn.alive = False
                if not loop.is_closed():
                    loop.call_soon_threadsafe(self._exited, generation)

        loop.create_task(self._on_hello(hello))
        threading.Thread(target=run, name=f"inprocess-worker-{generation}", daemon=True).start()

    def _exited(self, generation: int) -> None:
        if generation != self._generation:
            return
        self._on_lost(self._loop.time() if self._loop else 0.0)
        if self._stopping or self.draining:
            self.exited.set()
            return
        self.restarts += 1
        assert self._loop is not None
        self._loop.call_later(self.restart_delay_s, self._spawn)

    async def stop(self) -> None:
        self._stopping = True
        worker = self.worker
        if worker is not None and self._conn is not None and self._conn.alive:  # not one that died
            worker.drain()
            await asyncio.get_running_loop().run_in_executor(None, worker.stopped.wait, 5.0)

    def drain(self) -> None:
        """What SIGTERM does to ``serve``: the worker stops admitting and finishes (or cuts, after
        its drain timeout) what it has; the transport then fails what is left with ``shutdown``."""
        self.draining = True
        if self.worker is not None:
            self.worker.drain()

    # -- carrying -----------------------------------------------------------------------

    async def _send(self, data: bytes) -> None:
        worker, conn = self.worker, self._conn
        if worker is None or conn is None or not conn.alive:
            return
        for line in data.splitlines():
            message = decode(line)
            worker._on_message(message)
            worker.inbox.put((conn, message))

    def _from_worker(self, generation: int, data: bytes) -> None:
        """On the worker's thread: hand its lines to the event loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(self._deliver, generation, data)

    def _deliver(self, generation: int, data: bytes) -> None:
        if generation != self._generation:
            return  # from a worker already replaced
        for line in data.splitlines():
            try:
                self._on_message(decode(line))
            except ValueError as exc:
                log.warning("dropping a malformed message from the worker: %s", exc)

