"""The link's fast tests: the in-process transport with the simulated engine, no sockets, no HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import SimEngine
from scheduler.link.inprocess import InProcessTransport
from scheduler.link.messages import Delta, Done, Error, Hello, JobEvent, Rejected, decode
from scheduler.link.transport import JobHandle, Transport
from scheduler.worker.loop import EngineWorker


def sim_worker(engine: SimEngine | None = None, *, lanes: int = 2, ctx: int = 512, prepare_in_thread: bool = True) -> EngineWorker:
    engine = engine or SimEngine(n_lanes=lanes, lane_ctx=ctx)
    return EngineWorker(engine, SchedulerConfig(max_batch=engine.n_lanes, lane_ctx=engine.lane_ctx), model_name="sim", prepare_in_thread=prepare_in_thread)


def transport(make_engine: Callable[[], SimEngine] | None = None, **kwargs: Any) -> InProcessTransport:
    return InProcessTransport(lambda: sim_worker(make_engine() if make_engine else None), **kwargs)


def completion(prompt: str = "Once upon a time", max_tokens: int = 40, **extra: Any) -> dict[str, Any]:
    return {"endpoint": "completions", "model": "sim", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, **extra}


async def outcome(handle: JobHandle, timeout_s: float = 30.0) -> tuple[str, JobEvent]:
    """(the text delivered, the event that ended the job); the timeout only bounds a hang."""
    parts: list[str] = []
    while True:
        event = await asyncio.wait_for(handle.next_event(), timeout_s)
        if isinstance(event, Delta):
            parts.append(event.text)
        elif isinstance(event, (Done, Error, Rejected)):
            return "".join(parts), event


async def run_one(link: InProcessTransport, **fields: Any) -> tuple[str, JobEvent]:
    handle = await link.submit(**fields)
    try:
        return await outcome(handle)
    finally:
        link.finish(handle)


class RecordingCarrier(Transport):
    """A carrier with no worker behind it: records what the link sends (decoded); the send of a
    message with ``pause_on`` in it waits for ``go`` (a full socket). The test plays the worker
    through ``_on_hello``, ``_on_message`` and ``_on_lost``."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[Any] = []
        self.pause_on = ""
        self.go = asyncio.Event()

    def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def _send(self, data: bytes) -> None:
        self.sent.append(decode(data))
        if self.pause_on and self.pause_on.encode() in data:
            await self.go.wait()


def hello(pid: int, lanes: int = 2) -> Hello:
    return Hello(model="m", engine="sim", n_lanes=lanes, lane_ctx=512, pid=pid)
