"""Redis-mode tests run against a real ``redis-server`` (Debian's; ``.ci/run`` installs it) that
the session starts on a free loopback port, with no persistence, and stops at the end."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import SimEngine
from scheduler.link.messages import Done
from scheduler.link.redis_transport import RedisTransport, RedisWorkerLink
from scheduler.link.transport import JobHandle
from scheduler.worker.loop import EngineWorker
from tests.link.conftest import completion, outcome

__all__ = ["completion", "outcome"]  # the link tests' job helpers, for the Redis tests to import from here


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server child on 127.0.0.1; ``stop()`` and ``start()`` again on the same port."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:  # CI installs it: a missing server fails these tests, never skips them
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="superfluid-redis-")
        # removed with this object (or at exit): stop() may be followed by start() in it again;
        # every run of the suite left ~30 of them in /tmp
        weakref.finalize(self, shutil.rmtree, self.dir, True)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", self.dir]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        self.proc = None


# a script that keeps Redis busy (every other client waits) for ARGV[1] milliseconds
SPIN = """
local t = redis.call('TIME')
local until_us = t[1] * 1000000 + t[2] + ARGV[1] * 1000
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= until_us
"""


class Busy:
    """Redis kept busy for ``ms`` milliseconds by SPIN, sent from here before this returns, and
    running: a PING on another connection goes unanswered. (A command sent meanwhile is run
    after the script; one held by CLIENT PAUSE is dropped if its connection closes first.)"""

    def __init__(self, port: int, ms: int) -> None:
        self.joined = False
        self.conn = redis.Connection(port=port)
        self.conn.send_command("EVAL", SPIN, 0, ms)  # in Redis's socket buffer when this returns
        deadline = time.monotonic() + 10
        while True:
            probe = redis.Redis(port=port, socket_timeout=0.05, retry=Retry(NoBackoff(), 0))
            try:
                probe.ping()
            except redis.TimeoutError:
                return
            finally:
                probe.close()
            assert time.monotonic() < deadline, "Redis never got busy with the script"

    def over(self) -> bool:
        """Whether the script has ended (its reply is in): a test that had to act while Redis
        was busy and was not scheduled in time (a loaded machine) did not test anything."""
        return self.joined or bool(self.conn.can_read(timeout=0))

    def join(self) -> None:
        """Wait for the script's end (once: a second call returns at once)."""
        if self.joined:
            return
        self.joined = True
        self.conn.read_response()
        self.conn.disconnect()


SPINS_MS = (300, 1200, 4800)


async def under_spin(port: int, attempt: Callable[[Busy], Awaitable[bool]]) -> Busy:
    """Run ``attempt`` while Redis is busy with a spinning script, and return that Busy. An
    attempt returns False when it finds the spin over (``Busy.over``) before it could act: this
    machine stalled for longer than the spin (a CI run compiling beside the tests does). It is
    then run again under a spin four times longer. A slow machine costs time, never a false
    failure; an attempt that acted in time asserts what it tests."""
    for ms in SPINS_MS:
        busy = Busy(port, ms)
        try:
            acted = await attempt(busy)
        except BaseException:
            await asyncio.to_thread(busy.join)
            raise
        if acted:
            return busy
        await asyncio.to_thread(busy.join)
    raise AssertionError(f"Redis answered before the test could act under every spin ({SPINS_MS} ms)")


def commands_run(client: redis.Redis, command: str) -> int:
    """How many times Redis has run ``command`` (INFO commandstats): proof a command reached it."""
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


async def until_sent(client: Any, timeout_s: float = 10.0) -> None:
    """Wait until an asyncio Redis client has a command on one of its connections: with Redis
    paused, a command that waits there for its reply. The timeout only bounds a hang."""
    deadline = time.monotonic() + timeout_s
    while not client.connection_pool._in_use_connections:
        assert time.monotonic() < deadline, "no command was sent to Redis"
        await asyncio.sleep(0.001)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def prefix() -> str:
    """Every test has its own key prefix on the shared server."""
    return f"t{uuid.uuid4().hex[:8]}:"


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis(port=redis_server.port)
    yield c
    c.close()


# -- a fleet in this process: sim workers on threads, heads on the test's event loop ----------


SIM_LEASE_MS = 1000


class SimFleetWorker:
    def __init__(
        self, url: str, prefix: str, *, lanes: int = 2, engine: SimEngine | None = None, class_lanes: dict[Any, int] | None = None, drain_timeout_s: float = 5.0
    ) -> None:
        self.drain_timeout_s = drain_timeout_s  # how long a drain lets the jobs it has run on
        self.engine = engine or SimEngine(n_lanes=lanes, lane_ctx=512)
        config = SchedulerConfig(max_batch=self.engine.n_lanes, lane_ctx=self.engine.lane_ctx, class_lanes=dict(class_lanes or {}))
        self.worker = EngineWorker(self.engine, config, model_name="sim", prepare_in_thread=True)
        # A lease of a second instead of three: a test of a worker's loss waits for it to lapse.
        self.link = RedisWorkerLink(self.worker, url, prefix=prefix, starvation_s=60.0, lease_ms=SIM_LEASE_MS)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.worker.serve(self.link, drain_timeout_s=self.drain_timeout_s)  # type: ignore[arg-type]
        except BaseException as exc:  # a simulated crash: the process would be gone
            self.error = exc
            self.link.close()

    def start(self) -> SimFleetWorker:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.worker.drain()
        self.thread.join(10)


async def head(url: str, prefix: str) -> RedisTransport:
    link = RedisTransport(url, prefix=prefix, poll_s=0.2)
    assert await link.wait_connected(20), "no worker showed up"
    return link


@asynccontextmanager
async def fleet(url: str, prefix: str, worker: SimFleetWorker | None = None) -> AsyncIterator[tuple[SimFleetWorker, RedisTransport]]:
    """``worker`` (not started yet; a two-lane sim worker if none) started on its thread, and a
    head on the test's loop that has seen it: ``(worker, head)``. On the way out the head stops,
    then the worker (it drains)."""
    worker = (worker or SimFleetWorker(url, prefix)).start()
    try:
        link = await head(url, prefix)
    except BaseException:
        worker.stop()
        raise
    try:
        yield worker, link
    finally:
        await link.stop()
        worker.stop()


async def answer_each(link: RedisTransport, handles: list[JobHandle]) -> None:
    """Wait for each job's Done (an error fails the test) and finish it, as a head's consumer does."""
    for handle in handles:
        _text, done = await outcome(handle)
        assert isinstance(done, Done), done
        link.finish(handle)


@pytest.fixture(autouse=True)
async def _close_this_loops_limiters() -> AsyncIterator[None]:
    """Admission's shared Redis limiters belong to the test's event loop: close them with it, so
    a connection left half-open (Redis was stopped) is not collected during a later test."""
    yield
    from keys import limits

    loop_id = id(asyncio.get_running_loop())
    for key in [k for k in limits._limiters if k[0] == loop_id]:
        await limits._limiters.pop(key).aclose()
