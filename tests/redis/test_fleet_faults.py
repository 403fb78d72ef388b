"""A Redis fleet under faults an operator meets: a Redis that stalls past a worker's socket
timeout while it picks, and a cancel that reaches Redis only after its head has let go of the
job's stream (Redis away for a moment) while the worker goes on writing."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any

import redis

from scheduler.link.messages import Delta, Done
from scheduler.link.redis_transport import Scripts

from .conftest import Busy, RedisServer, SimFleetWorker, completion, fleet, head, outcome, under_spin
from .test_fleet_sim import slow_sim


async def until(condition: Any, what: str, timeout_s: float = 20.0) -> None:
    """Wait for ``condition()``; the timeout only bounds a hang."""
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


class PickGate:
    """A worker's picks wait here (``parked``) while it is closed: one goes when the test lets
    one through (``one``), all while it is ``opened``. What each pick came to (how many jobs the
    worker took, or the pick's exception) is put on ``results``."""

    def __init__(self, link: Any) -> None:
        self.results: queue.Queue[Any] = queue.Queue()
        self._cond = threading.Condition()
        self._allowed = -1  # picks to let through; -1: every one
        self._parked = False
        pull_once = link._pull_once

        def gated(n_lanes: int) -> bool:
            with self._cond:
                while self._allowed == 0:
                    self._parked = True
                    self._cond.wait()
                self._parked = False
                if self._allowed > 0:
                    self._allowed -= 1
            before = len(link.held)
            try:
                more = pull_once(n_lanes)
            except Exception as exc:
                self.results.put(exc)
                raise
            self.results.put(len(link.held) - before)
            return more

        link._pull_once = gated

    def _let(self, allowed: int) -> None:
        with self._cond:
            self._allowed = allowed
            self._cond.notify_all()

    def one(self) -> None:
        self._let(1)

    def open(self) -> None:
        self._let(-1)

    def close(self) -> None:
        self._let(0)

    def parked(self) -> bool:
        with self._cond:
            return self._parked


def lost_markers(admin: redis.Redis, prefix: str, job_id: str) -> list[bytes]:
    return [fields[b"m"] for _id, fields in admin.xrange(f"{prefix}s:{job_id}") if b'"type":"lost"' in fields[b"m"]]


async def test_a_pick_whose_reply_a_stalled_redis_timed_out_is_run_by_its_worker_not_lost(redis_server: RedisServer, prefix: str) -> None:
    """Redis stalls (a slow script, a fork, a network hiccup) past a worker's socket timeout
    while the worker's pick waits behind it: the pick times out at the worker, but Redis still
    runs it when the stall ends, and leases the job to that worker. The worker never learned
    of the job, so nothing renewed its lease: it lapsed, the job was reaped as lost (a ``lost``
    marker, a pause of a lease for the client) and counted as a worker loss: a second such
    stall before it delivered text failed it with engine_crashed, with no worker ever gone.
    Now the worker sends the same pick again (its token), which answers the jobs it took."""
    worker = SimFleetWorker(redis_server.url, prefix)
    # a socket timeout shorter than production's 2 s, so that a spin of a second outlasts it,
    # and a lease long enough for the pick sent again to find its job still leased
    worker.link.client = redis.Redis.from_url(redis_server.url, socket_timeout=0.5, socket_connect_timeout=1.0)
    worker.link.scripts = Scripts(worker.link.client)
    worker.link.lease_ms = 10_000
    gate = PickGate(worker.link)
    worker.start()
    link = await head(redis_server.url, prefix)
    admin = redis.Redis.from_url(redis_server.url)
    try:
        reference, _ = await outcome(await link.submit(request=completion("story", max_tokens=30)))

        async def queued_job() -> Any:
            """A job in the queue, with the worker's next pick held at the gate."""
            gate.close()
            await until(gate.parked, "the worker's pick never reached the gate")
            while not gate.results.empty():  # what the picks before came to
                gate.results.get_nowait()
            handle = await link.submit(request=completion("story", max_tokens=30))
            await until(lambda: admin.hget(f"{prefix}job:{handle.job_id}", "state") == b"q", "the job was never queued")
            return handle

        handle = await queued_job()

        async def pick_while_stalled(busy: Busy) -> bool:
            nonlocal handle
            gate.one()  # one pick, sent while Redis spins
            result = await asyncio.to_thread(gate.results.get, True, 30)
            if isinstance(result, redis.TimeoutError):
                return True  # it timed out behind the spin: what this tests
            # the spin ended before the pick timed out (a slow machine): it took the job as usual
            assert result == 1, result
            await asyncio.to_thread(busy.join)
            gate.open()
            _text, done = await outcome(handle)
            assert isinstance(done, Done), done
            link.finish(handle)
            handle = await queued_job()
            return False

        busy = await under_spin(redis_server.port, pick_while_stalled)
        await asyncio.to_thread(busy.join)
        gate.open()
        text, done = await outcome(handle)
        assert isinstance(done, Done), done
        assert text == reference
        # run by the worker the stalled pick leased it to, never reaped as lost
        assert lost_markers(admin, prefix, handle.job_id) == []
        link.finish(handle)
    finally:
        gate.open()
        admin.close()
        await link.stop()
        worker.stop()


class _PickReplyLost:
    """A worker's scripts whose picks that take a job lose their reply ``times`` times: Redis
    ran the pick (the job is leased to this worker), the worker sees a timeout."""

    def __init__(self, scripts: Scripts, times: int) -> None:
        self._scripts, self.left = scripts, times
        self.picks = 0  # picks made through this object, ended

    def __getattr__(self, name: str) -> Any:
        script = getattr(self._scripts, name)
        if name != "pick":
            return script

        def pick(args: list[Any], client: Any = None) -> Any:
            reply = script(args, client)
            self.picks += 1
            if reply and self.left > 0:
                self.left -= 1
                raise redis.TimeoutError("Timeout reading from socket")
            return reply

        return pick


async def test_a_job_whose_picks_lose_their_reply_twice_is_not_failed_as_crashed(redis_server: RedisServer, prefix: str) -> None:
    """Two picks of one job in a row whose reply was lost (each ran in Redis: the job leased to
    a worker that never heard of it) read as two worker losses in a row: the client got
    engine_crashed though no worker died. Now each pick sent again answers what it took."""
    worker = SimFleetWorker(redis_server.url, prefix)
    worker.link.lease_ms = 10_000  # the pick sent again (half a second later) finds its job leased
    async with fleet(redis_server.url, prefix, worker) as (worker, link):
        reference, _ = await outcome(await link.submit(request=completion("story", max_tokens=30)))
        worker.link.scripts = lossy = _PickReplyLost(worker.link.scripts, times=2)
        # the worker's puller may be inside a pick made through the scripts before: once one pick
        # has ended through these (an idle one, every 0.2 s), every later pick goes through them
        while lossy.picks == 0:
            await asyncio.sleep(0.01)
        handle = await link.submit(request=completion("story", max_tokens=30))
        text, event = await outcome(handle)
        assert worker.link.scripts.left == 0  # type: ignore[attr-defined]
        assert isinstance(event, Done), event
        assert text == reference
        link.finish(handle)


class _CancelHeld:
    """A head's scripts whose cancel fails (Redis away for a moment) until ``go`` is set."""

    def __init__(self, scripts: Scripts) -> None:
        self._scripts = scripts
        self.go = asyncio.Event()
        self.failed = 0

    def __getattr__(self, name: str) -> Any:
        script = getattr(self._scripts, name)
        if name != "cancel":
            return script

        async def cancel(args: list[Any], client: Any = None) -> Any:
            if not self.go.is_set():
                self.failed += 1
                raise redis.ConnectionError("Error 111 connecting to Redis. Connection refused.")
            return await script(args, client)

        return cancel


async def test_a_stream_a_worker_wrote_again_before_its_jobs_cancel_arrived_is_deleted_by_the_cancel(redis_server: RedisServer, prefix: str) -> None:
    """A client leaves mid-stream; its head's cancel fails (Redis away for a moment) and is
    sent at the next tick. Meanwhile the head lets go of the job (the reader leaves and deletes
    the stream), and the worker, still holding the job in Redis, writes its next tokens: the
    stream is back. The cancel then stops the job, but the stream it wrote, that no one will
    read, stayed in Redis for its whole ten-minute TTL (one per such cancel). Now a cancel
    deletes the job's stream and resume note too: nothing of the job is left once it lands."""
    worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.01)).start()
    link = await head(redis_server.url, prefix)
    admin = redis.Redis.from_url(redis_server.url)
    stream = f"{prefix}s:{{}}"
    try:
        handle = await link.submit(request=completion(max_tokens=400))
        while not isinstance(await handle.next_event(), Delta):
            pass
        key = stream.format(handle.job_id)
        held = _CancelHeld(link.scripts)
        link._scripts = held  # type: ignore[assignment]
        reader = link._readers[handle.job_id]
        await link.cancel(handle)  # the client left
        link.finish(handle)
        assert held.failed and link._unsent_cancels
        await asyncio.wait([reader], timeout=20)  # it left, and deleted the stream
        assert reader.done()
        # the worker still runs the job (its cancel has not reached Redis): its next write
        await until(lambda: admin.exists(key) == 1, "the worker wrote nothing after the head let go of the stream")
        held.go.set()
        await until(lambda: not admin.exists(f"{prefix}job:{handle.job_id}"), "the cancel never reached Redis")
        await until(lambda: handle.job_id not in worker.link.held, "the worker did not stop the job")
        await until(lambda: all(j is None for j in worker.worker.scheduler.lanes), "the lane was not freed")
        assert not admin.exists(key), f"the cancelled job's stream is kept for {admin.ttl(key)} s"
    finally:
        admin.close()
        await link.stop()
        worker.stop()
