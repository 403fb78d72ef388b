"""The web side of the link: one asyncio connection to the engine worker, shared by requests.

If the worker dies, the connection drops and every job in flight is kept: once the supervisor
has started a new worker, each is submitted again, continuing from its prompt plus the text
already delivered (so the client sees a pause, not an error, and nothing twice). Only if no
worker comes back within ``reconnect_timeout_s`` do jobs end with ``engine_unavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .protocol import MAX_LINE_BYTES, decode, encode, error_dict

log = logging.getLogger("superfluid.link")

# Called with every worker snapshot, on the event loop. Apps register here (the dashboard's feed
# does in its AppConfig.ready) so the link knows nothing about who listens.
SNAPSHOT_LISTENERS: list[Callable[[dict[str, Any]], None]] = []


@dataclass(eq=False)
class JobHandle:
    """A submitted job as the web side sees it. Events arrive on ``events``."""

    job_id: str
    payload: dict[str, Any]
    events: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    accepted: bool = False
    delivered_text: str = ""
    delivered_tokens: int = 0
    restarts: int = 0

    def resubmission(self) -> dict[str, Any]:
        return {**self.payload, "resume_text": self.delivered_text, "resume_tokens": self.delivered_tokens}


class LinkClient:
    def __init__(self, socket_path: str, *, reconnect_timeout_s: float = 120.0) -> None:
        self.socket_path = socket_path
        self.reconnect_timeout_s = reconnect_timeout_s
        self.inflight: dict[str, JobHandle] = {}  # submitted and not yet done at the worker
        self.open: set[str] = set()  # submitted and not yet finished by the web side (response sent)
        self.hello: dict[str, Any] | None = None
        self.snapshot: dict[str, Any] | None = None
        self.draining = False
        self.worker_restarts = 0
        self._writer: asyncio.StreamWriter | None = None
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lost_since: float | None = None
        self.worker_config: dict[str, Any] | None = None  # the last ``config`` op, sent again on reconnect

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="superfluid-link")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def wait_connected(self, timeout_s: float) -> bool:
        self.start()
        try:
            await asyncio.wait_for(self._connected.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    # -- requests ----------------------------------------------------------------------

    async def submit(self, payload: dict[str, Any]) -> JobHandle:
        handle = JobHandle(job_id=uuid.uuid4().hex, payload=payload)
        self.inflight[handle.job_id] = handle
        self.open.add(handle.job_id)
        self.start()
        if self.connected:
            await self._send({"op": "submit", "id": handle.job_id, **payload})
        # otherwise it is sent when the worker (re)connects
        return handle

    async def cancel(self, handle: JobHandle) -> None:
        self.open.discard(handle.job_id)
        if self.inflight.pop(handle.job_id, None) is not None and self.connected:
            await self._send({"op": "cancel", "id": handle.job_id})

    def finish(self, handle: JobHandle) -> None:
        """The response for this job has been sent (or abandoned)."""
        self.inflight.pop(handle.job_id, None)
        self.open.discard(handle.job_id)

    async def send_config(self, config: dict[str, Any]) -> None:
        """Worker settings the admin can change (``{"class_lanes": {...}}``): sent now if
        connected, and again after every (re)connect, before any job is resubmitted."""
        self.worker_config = dict(config)
        self.start()
        if self.connected:
            await self._send({"op": "config", **self.worker_config})

    async def _send(self, message: dict[str, Any]) -> None:
        writer = self._writer
        if writer is None:
            return
        try:
            writer.write(encode(message))
            await writer.drain()
        except (ConnectionError, OSError):
            pass  # the reader notices the loss and resubmits

    # -- connection --------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self.socket_path, limit=MAX_LINE_BYTES)
            except (FileNotFoundError, ConnectionRefusedError, OSError):
                self._check_lost_deadline(loop.time())
                await asyncio.sleep(0.1)
                continue
            try:
                line = await reader.readline()
                hello = decode(line) if line else {}
                if hello.get("ev") != "hello":
                    raise ConnectionError("worker did not say hello")
                if self.hello is not None and hello.get("pid") != self.hello.get("pid"):
                    self.worker_restarts += 1
                self.hello = hello
                self._writer = writer
                self._lost_since = None
                self._connected.set()
                if self.worker_config is not None:
                    await self._send({"op": "config", **self.worker_config})
                for handle in list(self.inflight.values()):
                    await self._send({"op": "submit", "id": handle.job_id, **handle.resubmission()})
                while True:
                    line = await reader.readline()
                    if not line:
                        break
                    self._dispatch(decode(line))
            except (ConnectionError, OSError, ValueError) as exc:
                log.warning("link to the engine worker lost: %s", exc)
            finally:
                self._connected.clear()
                self._writer = None
                writer.close()
            self._lost_since = loop.time()
            for handle in self.inflight.values():
                handle.restarts += 1
            log.warning("engine worker went away with %d jobs in flight; waiting for it", len(self.inflight))

    def _check_lost_deadline(self, now: float) -> None:
        if self._lost_since is None or now - self._lost_since < self.reconnect_timeout_s:
            return
        for handle in list(self.inflight.values()):
            handle.events.put_nowait(
                {"ev": "error", "id": handle.job_id, "error": error_dict(503, "The engine worker is unavailable.", "server_error", "engine_unavailable")}
            )
        self.inflight.clear()

    def _dispatch(self, message: dict[str, Any]) -> None:
        ev = message.get("ev")
        if ev == "snapshot":
            self.snapshot = message.get("state")
            for listener in SNAPSHOT_LISTENERS:
                listener(self.snapshot or {})
            return
        handle = self.inflight.get(str(message.get("id")))
        if handle is None:
            return
        if ev == "accepted":
            if handle.accepted:
                return  # a resubmission after a worker restart
            handle.accepted = True
        elif ev == "delta":
            handle.delivered_text += message.get("text", "")
            handle.delivered_tokens = int(message.get("tokens", handle.delivered_tokens))
        elif ev in ("done", "error", "rejected"):
            self.inflight.pop(handle.job_id, None)
        handle.events.put_nowait(message)


_clients: dict[int, LinkClient] = {}


def get_link() -> LinkClient:
    """The process's link client for the running event loop, made on first use from settings."""
    from django.conf import settings

    loop = asyncio.get_running_loop()
    client = _clients.get(id(loop))
    if client is None:
        client = LinkClient(settings.SUPERFLUID_SOCKET)
        _clients[id(loop)] = client
        client.start()
    return client
