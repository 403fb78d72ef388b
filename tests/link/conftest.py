"""The link's fast tests: the in-process transport with the simulated engine, no sockets, no HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import SimEngine
from scheduler.link.inprocess import InProcessTransport
from scheduler.link.messages import Delta, Done, Error, JobEvent, Rejected
from scheduler.link.transport import JobHandle
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
