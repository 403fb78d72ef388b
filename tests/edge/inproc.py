"""The in-process middle layer: the real ASGI application, driven by Channels' communicator,
against the real worker code around the simulated engine, in a thread of this process.

Nothing here is a real server: no daphne, no subprocess, no model. What runs is everything in
between (consumers, Django views and middleware, admission, the link client, the worker's
loop, the scheduler) with scheduler/engines/sim.py as the engine, reached through the
in-process transport (scheduler/link/inprocess.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from channels.testing import ApplicationCommunicator

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.inprocess import InProcessTransport
from scheduler.worker.loop import EngineWorker

MODEL = "sim"
CLIENT = ("127.0.0.1", 50000)
HOST = b"127.0.0.1:8000"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def is_error_object(self) -> bool:
        """An OpenAI error object: {"error": {"message", "type", "param", "code"}}."""
        try:
            error = self.json()["error"]
        except (ValueError, KeyError, TypeError):
            return False
        return isinstance(error, dict) and set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)

    def sse_data(self) -> list[str]:
        """The ``data:`` payloads of an event stream, in order."""
        return [line[len("data: ") :] for line in self.body.decode().split("\n") if line.startswith("data: ")]


class SimWorker:
    """How the in-process transport makes its worker: EngineWorker + SimEngine, on a thread.
    A subclass names another simulated engine as ``engine_class``."""

    engine_class: type[SimEngine] = SimEngine

    def __init__(self, *, lanes: int = 2, lane_ctx: int = 512, step_sleep_s: float = 0.0, stream_interval_ms: int = 0) -> None:
        self.lanes, self.lane_ctx, self.step_sleep_s = lanes, lane_ctx, step_sleep_s
        self.stream_interval_ms = stream_interval_ms  # serve's --stream-interval-ms (the fake clock's)
        self.transport: InProcessTransport | None = None

    def make_worker(self) -> EngineWorker:
        clock = FakeClock()
        engine = self.engine_class(n_lanes=self.lanes, lane_ctx=self.lane_ctx, clock=clock)
        if self.step_sleep_s > 0:  # a slower engine, for streams that must still be running
            engine.on_call = lambda _n: time.sleep(self.step_sleep_s)
        config = SchedulerConfig(max_batch=self.lanes, lane_ctx=self.lane_ctx)
        return EngineWorker(engine, config, model_name=MODEL, clock=clock, prepare_in_thread=True, stream_interval_ms=self.stream_interval_ms)

    def busy(self) -> tuple[int, int]:
        """(lanes bound, jobs queued) as the scheduler has them now."""
        assert self.transport is not None and self.transport.worker is not None
        worker = self.transport.worker
        lanes = sum(1 for job in worker.scheduler.lanes if job is not None)
        return lanes, len(worker.contexts) - lanes


@contextlib.asynccontextmanager
async def attached(worker: SimWorker, *, keys: dict[str, Any] | None = None):  # type: ignore[no-untyped-def]
    """On the running event loop: the in-process transport to ``worker`` and a key runtime with
    a fixed snapshot (``keys``: digest -> Key; none by default), as the server has per process."""
    from activity.writer import flush, get_writer
    from keys.runtime import KeyRuntime, Snapshot
    from superfluid_site.runtime import forget, web_runtime

    given_up = get_writer().failed
    loop = asyncio.get_running_loop()
    link = InProcessTransport(worker.make_worker)
    worker.transport = link
    web = web_runtime()
    web.install_link(link)
    rt = KeyRuntime(loop, watch=False)
    rt.snapshot = Snapshot(version=1, keys_by_digest=dict(keys or {}))
    rt.loaded.set()
    web.set_keys(rt)
    try:
        assert await link.wait_connected(10), "the simulated worker did not answer"
        yield link, rt
    finally:
        await asyncio.to_thread(flush)  # the rows of this test's requests, while its database is there
        await link.stop()
        forget(loop)
        worker.transport = None
    # A row the writer gave up on (after ~1.5 s of retries) is a test without database access.
    assert get_writer().failed == given_up, "activity rows could not be written: mark the test django_db"



@contextlib.contextmanager
def attached_loop(worker: SimWorker, **settings: Any) -> Iterator[asyncio.AbstractEventLoop]:
    """A new event loop with ``worker`` :func:`attached` on it, for a synchronous test (a
    Hypothesis test drives its requests with ``loop.run_until_complete``); ``settings``
    overridden meanwhile (django.test.override_settings)."""
    from django.test import override_settings

    loop = asyncio.new_event_loop()
    context = attached(worker)
    try:
        with override_settings(**settings):
            loop.run_until_complete(context.__aenter__())
            try:
                yield loop
            finally:
                loop.run_until_complete(context.__aexit__(None, None, None))
    finally:
        loop.close()

def application() -> Any:
    from superfluid_site.asgi import application as app

    return app


def scope(method: str, path: str, headers: list[tuple[bytes, bytes]] | None = None, *, host: bytes | None = HOST) -> dict[str, Any]:
    path, _, query = path.partition("?")
    hdrs = list(headers or [])
    if host is not None and not any(k.lower() == b"host" for k, _ in hdrs):
        hdrs.insert(0, (b"host", host))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method.upper(),
        "scheme": "http",
        "path": path,
        "raw_path": path.encode("utf-8", "surrogateescape"),
        "query_string": query.encode("utf-8", "surrogateescape"),
        "root_path": "",
        "headers": hdrs,
        "client": CLIENT,
        "server": ("127.0.0.1", 8000),
    }


async def request(
    method: str,
    path: str,
    body: bytes = b"",
    headers: list[tuple[bytes, bytes]] | None = None,
    *,
    timeout_s: float = 10.0,
    host: bytes | None = HOST,
) -> Reply:
    """One request through the ASGI application; the whole reply (a stream read to its end)."""
    comm = ApplicationCommunicator(application(), scope(method, path, headers, host=host))
    await comm.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await comm.receive_output(timeout_s)
    assert start["type"] == "http.response.start", start
    chunks = []
    while True:
        message = await comm.receive_output(timeout_s)
        assert message["type"] == "http.response.body", message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    await comm.send_input({"type": "http.disconnect"})
    with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
        await comm.wait(timeout_s)
    hdrs = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in start.get("headers", [])}
    return Reply(start["status"], hdrs, b"".join(chunks))


def chat_body(content: str = "hi", **fields: Any) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}).encode()


JSON = [(b"content-type", b"application/json")]


async def refused_count(route: str, body: dict[str, Any], status: int) -> dict[str, Any]:
    """A token-count route (nothing generated) given ``body``: its error object, which must
    come with ``status``; the route's GET must be a JSON 405. (The counting routes refuse what
    the generating route they count for refuses, naming the same field.)"""
    async with attached(SimWorker()):
        reply = await request("POST", route, json.dumps(body).encode(), JSON)
        wrong_method = await request("GET", route)
    assert reply.status == status and reply.is_error_object(), reply.body
    assert wrong_method.status == 405 and wrong_method.is_error_object()
    return reply.json()["error"]  # type: ignore[no-any-return]


async def writes_of_a_reader_behind(sim: SimWorker, body: bytes) -> list[bytes]:
    """The writes of a chat stream whose reader fell behind: the event loop is blocked (as by
    a busy web process) while the worker's thread finishes every job, so all the remaining
    events are queued for the stream when it runs again."""
    comm = ApplicationCommunicator(application(), scope("POST", "/v1/chat/completions", JSON))
    await comm.send_input({"type": "http.request", "body": body, "more_body": False})
    assert (await comm.receive_output(10))["type"] == "http.response.start"
    deadline = time.monotonic() + 10
    while sim.busy() != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.01)  # noqa: ASYNC251 (blocking the loop is the point)
    assert sim.busy() == (0, 0)
    writes: list[bytes] = []
    while True:
        message = await comm.receive_output(10)
        writes.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    await comm.send_input({"type": "http.disconnect"})
    return writes


def stand_in_pool(monkeypatch: Any, acquire: Callable[[str, int, int], Awaitable[Any]]) -> None:
    """Several models, as the consumers see them: a router of one model (MODEL, 512 tokens a
    lane) whose dispatch is ``acquire(model, priority, jobs)``, set in place of the pool."""
    from api import consumers

    class Pool:
        draining = False
        setup = SimpleNamespace(ctx_sizes={MODEL: 512})

        def names(self) -> list[str]:
            return [MODEL]

        def route(self, name: str, *, fim: bool) -> str:
            return MODEL

        async def acquire(self, model: str, priority: int, *, preempts: bool = False, jobs: int = 1) -> Any:
            return await acquire(model, priority, jobs)

        def release(self, ticket: object) -> None:
            pass

    monkeypatch.setattr(consumers, "get_pool", Pool)
