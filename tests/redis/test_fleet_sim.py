"""Heads and workers around one Redis, in this process, with the simulated engine: jobs through
any head reach any worker, a worker's crash resumes its jobs elsewhere from the text delivered,
cancels reach the worker holding the job, admin caps reach every worker, and an interactive
arrival with every lane of the fleet busy preempts one lower-class lane, and a head that stops
leaves no connection to Redis behind."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from typing import Any

import redis

from scheduler.core.qos import QosClass
from scheduler.core.types import TickPlan, TickResult
from scheduler.engines.sim import SimEngine
from scheduler.link.messages import Config, Delta, Done, Error
from scheduler.link.redis_transport import RedisTransport
from scheduler.link.transport import JobHandle

from .conftest import (
    Busy,
    RedisServer,
    SimFleetWorker,
    answer_each,
    completion,
    fleet,
    head,
    outcome,
    under_spin,
    until_sent,
)


def slow_sim(seconds_per_call: float = 0.01, lanes: int = 2) -> SimEngine:
    engine = SimEngine(n_lanes=lanes, lane_ctx=512)
    engine.on_call = lambda n: time.sleep(seconds_per_call)
    return engine


class CrashingSim(SimEngine):
    """Raises out of ``execute`` after ``crash_after`` calls: the worker (its process) is gone."""

    def __init__(self, crash_after: int) -> None:
        super().__init__(n_lanes=2, lane_ctx=512)
        self.crash_after = crash_after

    def execute(self, plan: TickPlan, should_stop: Any) -> TickResult:
        time.sleep(0.005)
        result = super().execute(plan, should_stop)
        if len(self.calls) >= self.crash_after:
            raise RuntimeError("simulated engine crash")
        return result


async def test_jobs_through_two_heads_are_served_by_two_workers(redis_server: RedisServer, prefix: str) -> None:
    workers = [SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.002)).start() for _ in range(2)]
    heads = [await head(redis_server.url, prefix) for _ in range(2)]
    handles = [await heads[i % 2].submit(request=completion(f"prompt {i}", max_tokens=20)) for i in range(8)]
    results = [await outcome(h) for h in handles]
    for (text, done), h in zip(results, handles, strict=True):
        assert isinstance(done, Done) and done.usage["completion_tokens"] == 20 and len(text) == 20
        heads[0].finish(h) if h.job_id in heads[0].open else heads[1].finish(h)
    served = [w.worker.stats["requests_total"] for w in workers]
    assert sum(served) == 8 and all(n > 0 for n in served)
    # each head sees the whole fleet, from its next read of it (every poll_s; the jobs can all be
    # done before a worker that published a moment after the head's first read is seen)
    deadline = time.monotonic() + 10
    while len(heads[0].workers) < 2:
        assert time.monotonic() < deadline, heads[0].workers
        await asyncio.sleep(0.01)
    assert len(heads[0].workers) == 2
    for h in heads:
        await h.stop()
    for w in workers:
        w.stop()


async def test_a_head_stopped_while_deleting_a_finished_jobs_stream_leaves_no_connection_open(redis_server: RedisServer, prefix: str) -> None:
    worker = SimFleetWorker(redis_server.url, prefix).start()
    admin = redis.Redis.from_url(redis_server.url)
    link = await head(redis_server.url, prefix)
    named = f"head:{link.head_id}"
    handle = await link.submit(request=completion(max_tokens=5))
    _text, done = await outcome(handle)
    assert isinstance(done, Done)
    assert [c for c in admin.client_list() if c["name"] == named] != []

    async def readers_gone() -> None:
        deadline = time.monotonic() + 10
        while link._readers:  # the reader has left: finish() deletes the stream itself
            assert time.monotonic() < deadline, "the stream's reader did not leave after Done"
            await asyncio.sleep(0.01)

    await readers_gone()
    # Redis busy (a script spinning): the DELETE is still waiting when the head stops

    async def stop_while_deleting(busy: Busy) -> bool:
        nonlocal handle
        link.finish(handle)
        # the DELETE is sent, and waits behind the script: its task has run into the call (a
        # connection in use alone may be a tick's command, and the DELETE's task not begun yet)
        while any(inspect.getcoroutinestate(t.get_coro()) == inspect.CORO_CREATED for t in link._forgetting):
            await asyncio.sleep(0)
        await until_sent(link._redis())
        if not busy.over():
            assert link._forgetting, "the DELETE ended before the head stopped"
            return True
        await asyncio.to_thread(busy.join)  # it may have ended first: again, with a new job
        handle = await link.submit(request=completion(max_tokens=5))
        _text, done = await outcome(handle)
        assert isinstance(done, Done)
        # as for the first job: a finish() while the reader is still there leaves the DELETE to
        # the reader, not to the DELETE this test stops the head under
        await readers_gone()
        return False

    busy = await under_spin(redis_server.port, stop_while_deleting)
    await link.stop()
    await asyncio.to_thread(busy.join)
    deadline = time.monotonic() + 5
    while admin.exists(f"{prefix}s:{handle.job_id}"):  # the stream is deleted, one way or another
        assert time.monotonic() < deadline, "the finished job's stream was never deleted"
        await asyncio.sleep(0.01)
    # closing the client under the DELETE made its retry open a connection that nothing closed
    assert [c for c in admin.client_list() if c["name"] == named] == []
    admin.close()
    worker.stop()


async def test_a_head_stopped_right_after_finishing_a_job_still_deletes_its_stream(redis_server: RedisServer, prefix: str) -> None:
    """finish() leaves a finished job's DELETE to a task, and stop() waits for that task: but a
    stop() that came before the task first ran (no await between them: a consumer's finish, then
    the server's shutdown) found the link stopped when the task asked for its client, and the
    DELETE was never sent (the stream and its resume note stayed for their whole TTL). Under a
    loaded machine this was the fleet test's "stream was never deleted": its DELETE task had not
    run yet when the head stopped."""
    worker = SimFleetWorker(redis_server.url, prefix).start()
    admin = redis.Redis.from_url(redis_server.url)
    link = await head(redis_server.url, prefix)
    named = f"head:{link.head_id}"
    try:
        handle = await link.submit(request=completion(max_tokens=5))
        _text, done = await outcome(handle)
        assert isinstance(done, Done)
        await link.remember_stream(handle.job_id, {"id": "chatcmpl-x"})
        deadline = time.monotonic() + 10
        while link._readers:  # the reader has left: finish() deletes the stream itself
            assert time.monotonic() < deadline, "the stream's reader did not leave after Done"
            await asyncio.sleep(0.01)
        assert admin.exists(f"{prefix}s:{handle.job_id}", f"{prefix}r:{handle.job_id}") == 2
        link.finish(handle)
        await link.stop()  # before the DELETE's task has run at all
        assert admin.exists(f"{prefix}s:{handle.job_id}", f"{prefix}r:{handle.job_id}") == 0
        assert [c for c in admin.client_list() if c["name"] == named] == []
    finally:
        await link.stop()
        admin.close()
        worker.stop()


async def test_a_worker_crash_resumes_its_jobs_on_another_worker_from_the_text_delivered(redis_server: RedisServer, prefix: str) -> None:
    reference_worker = SimFleetWorker(redis_server.url, prefix).start()
    link = await head(redis_server.url, prefix)
    reference = [await outcome(await link.submit(request=completion(f"story {i}", max_tokens=60))) for i in range(2)]
    reference_worker.stop()
    reference_worker.link.close()

    doomed = SimFleetWorker(redis_server.url, prefix, engine=CrashingSim(crash_after=25)).start()
    handles = [await link.submit(request=completion(f"story {i}", max_tokens=60)) for i in range(2)]
    # both jobs are on the doomed worker and have delivered text before it dies
    for h in handles:
        while h.delivered_tokens == 0:
            await asyncio.sleep(0.01)
    spare = SimFleetWorker(redis_server.url, prefix).start()
    results = [await outcome(h) for h in handles]
    assert doomed.error is not None  # it did crash
    for (text, done), (ref_text, _ref_done) in zip(results, reference, strict=True):
        assert isinstance(done, Done) and done.usage["completion_tokens"] == 60
        assert text == ref_text  # nothing repeated, nothing lost
    # two requests, counted by the worker that accepted them; resumed elsewhere, not again
    assert (doomed.worker.stats["requests_total"], spare.worker.stats["requests_total"]) == (2, 0)
    await link.stop()
    spare.stop()


async def test_cancel_reaches_the_worker_holding_the_job(redis_server: RedisServer, prefix: str) -> None:
    worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.01)).start()
    link = await head(redis_server.url, prefix)
    handle = await link.submit(request=completion(max_tokens=400))
    while not isinstance(await handle.next_event(), Delta):
        pass
    await link.cancel(handle)
    deadline = time.monotonic() + 10
    while any(j is not None for j in worker.worker.scheduler.lanes):
        assert time.monotonic() < deadline, "the lane was not freed"
        await asyncio.sleep(0.01)
    assert worker.link.held == {}
    await link.stop()
    worker.stop()


async def test_admin_lane_caps_reach_every_worker(redis_server: RedisServer, prefix: str) -> None:
    workers = [SimFleetWorker(redis_server.url, prefix).start() for _ in range(2)]
    link = await head(redis_server.url, prefix)
    await link.configure(Config(class_lanes={"background": 1}))
    deadline = time.monotonic() + 5
    while not all(w.worker.scheduler.config.class_lanes.get(QosClass.BACKGROUND) == 1 for w in workers):
        assert time.monotonic() < deadline, "a worker did not get the cap"
        await asyncio.sleep(0.02)
    late = SimFleetWorker(redis_server.url, prefix).start()  # a worker that joins later reads it too
    while late.worker.scheduler.config.class_lanes.get(QosClass.BACKGROUND) != 1:
        assert time.monotonic() < deadline + 5
        await asyncio.sleep(0.02)
    await link.stop()
    for w in [*workers, late]:
        w.stop()


async def test_admin_lane_caps_lost_by_redis_reach_a_worker_that_joins_after(redis_server: RedisServer, prefix: str, client: redis.Redis) -> None:
    # Redis restarted empty between two of the head's polls: the head never saw it away, so it
    # never sent the caps again, and every worker started from then on ran without them
    first = SimFleetWorker(redis_server.url, prefix).start()
    link = await head(redis_server.url, prefix)
    await link.configure(Config(class_lanes={"background": 1}))
    deadline = time.monotonic() + 10
    while client.get(prefix + "config") is None:
        assert time.monotonic() < deadline, "the head never stored the caps"
        await asyncio.sleep(0.02)
    client.delete(prefix + "config")
    late = SimFleetWorker(redis_server.url, prefix).start()
    while late.worker.scheduler.config.class_lanes.get(QosClass.BACKGROUND) != 1:
        assert time.monotonic() < deadline, "a worker that joined after the loss did not get the cap"
        await asyncio.sleep(0.02)
    await link.stop()
    for w in (first, late):
        w.stop()


async def test_an_interactive_arrival_with_the_fleet_busy_preempts_one_background_lane(redis_server: RedisServer, prefix: str) -> None:
    workers = [SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.01)).start() for _ in range(2)]
    heads = [await head(redis_server.url, prefix) for _ in range(2)]
    background = [await heads[0].submit(request=completion(f"bg {i}", max_tokens=300), qos=3) for i in range(6)]
    # every lane of both workers busy with background work, two more waiting
    deadline = time.monotonic() + 10
    while sum(len(w.link.held) for w in workers) < 4:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    chat = await heads[1].submit(request=completion("hello", max_tokens=5), qos=0)
    text, done = await outcome(chat)
    assert isinstance(done, Done) and len(text) == 5
    # it ran before any background job finished, and exactly one lane was preempted fleet-wide
    assert not any(b.job_id not in heads[0].inflight for b in background)
    preemptions = sum(w.worker.scheduler.counters["preemptions"] for w in workers)
    assert preemptions == 1
    for b in background:
        await heads[0].cancel(b)
    for h in heads:
        await h.stop()
    for w in workers:
        w.stop()


async def test_a_job_cancelled_or_failed_while_no_worker_is_alive_leaves_the_queue(redis_server: RedisServer, prefix: str) -> None:
    """A client that gives up while every worker is away (restarting, or gone for good) takes its
    job out of the Redis queue, and so does a job the head fails after --reconnect-timeout: it
    used to stay queued and run for nobody, once aged ahead of newer work, when a worker came."""
    import redis.asyncio as aioredis

    from scheduler.link.redis_transport import N_CLASSES

    worker = SimFleetWorker(redis_server.url, prefix, lanes=1, engine=slow_sim(0.01, lanes=1)).start()
    link = RedisTransport(redis_server.url, prefix=prefix, poll_s=0.05, reconnect_timeout_s=1.0)
    assert await link.wait_connected(20)
    client = aioredis.from_url(redis_server.url)

    async def queued() -> int:
        return sum([await client.zcard(f"{prefix}q:{c}") for c in range(N_CLASSES)])

    try:
        running = await link.submit(request=completion("long", max_tokens=150))
        while not isinstance(await running.next_event(), Delta):
            pass
        waiting = [await link.submit(request=completion(f"queued {i}", max_tokens=5)) for i in range(2)]
        deadline = time.monotonic() + 10
        while await queued() < 2:  # behind the one lane
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        worker.stop()  # drains (the long job ends), takes nothing more, and leaves
        worker.link.close()
        while link.connected:
            assert time.monotonic() < deadline + 10
            await asyncio.sleep(0.01)
        await link.cancel(waiting[0])  # the client of the first went away
        _text, failed = await outcome(waiting[1])  # the second is failed after reconnect_timeout_s
        assert isinstance(failed, Error) and failed.reason == "engine_unavailable"
        deadline = time.monotonic() + 10
        while await queued():
            assert time.monotonic() < deadline, "a job nobody waits for is still queued"
            await asyncio.sleep(0.05)
    finally:
        await client.aclose()
        await link.stop()


async def test_a_head_that_stops_waits_for_the_cancels_on_their_way(redis_server: RedisServer, prefix: str) -> None:
    """A client leaves as its head shuts down: the job's cancel was on its way to Redis when
    ``stop()`` began, and ``stop()`` returned without it (the process then exits and the cancel
    never goes): the job, queued behind the fleet's work, ran later for nobody. Now ``stop()``
    waits for those cancels (a bounded while) before it lets go of Redis."""
    import redis.asyncio as aioredis

    from scheduler.link.redis_transport import N_CLASSES

    worker = SimFleetWorker(redis_server.url, prefix, lanes=1, engine=slow_sim(0.01, lanes=1)).start()
    link = await head(redis_server.url, prefix)
    client = aioredis.from_url(redis_server.url)

    async def queued() -> int:
        return sum([await client.zcard(f"{prefix}q:{c}") for c in range(N_CLASSES)])

    send_cancel = link.scripts.cancel

    async def slow_cancel(args: list[object]) -> object:
        await asyncio.sleep(1.5)  # longer than the readers' last XREAD, which stop() waits for
        return await send_cancel(args)

    link.scripts.cancel = slow_cancel
    try:
        running = await link.submit(request=completion("long", max_tokens=300))
        while not isinstance(await running.next_event(), Delta):
            pass
        waiting = await link.submit(request=completion("left", max_tokens=5))
        deadline = time.monotonic() + 10
        while await queued() < 1:  # behind the one lane
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        leaving = asyncio.ensure_future(link.cancel(waiting))  # the client went away
        await asyncio.sleep(0.05)  # its cancel is on its way
        await link.stop()
        assert leaving.done(), "stop() returned before the cancel of a departed client went out"
        assert await queued() == 0  # the job left the queue: no worker will run it
    finally:
        await client.aclose()
        worker.stop()


async def test_a_submit_cancelled_on_its_way_to_redis_leaves_nothing_behind(redis_server: RedisServer, prefix: str) -> None:
    """The client goes away while its job's submit waits on Redis (busy here with a spinning script). The
    handle used to stay open for good (a drain waited its whole timeout for it) and the job,
    once Redis ran the submit, ran for nobody. Now the handle goes and the job is cancelled;
    a cancel that reaches Redis before its submit leaves a tombstone that refuses the submit."""
    import redis.asyncio as aioredis

    from scheduler.link.redis_transport import N_CLASSES

    worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.01)).start()
    link = await head(redis_server.url, prefix)
    admin = redis.Redis.from_url(redis_server.url)
    client = aioredis.from_url(redis_server.url)
    busy: Busy | None = None
    try:
        warm = await link.submit(request=completion("warm", max_tokens=2))  # connections open
        _text, done = await outcome(warm)
        assert isinstance(done, Done)
        link.finish(warm)
        served = worker.worker.stats["requests_total"]
        enqueue, enqueuing = link.scripts.enqueue, asyncio.Event()

        async def enqueue_noted(*args: Any, **kwargs: Any) -> Any:
            enqueuing.set()  # the submit's script is on its way: written before this task waits
            return await enqueue(*args, **kwargs)

        link.scripts.enqueue = enqueue_noted
        early = 0

        async def cancel_while_submitted(busy: Busy) -> bool:  # the submit waits behind the script
            nonlocal early
            enqueuing.clear()
            task = asyncio.get_running_loop().create_task(link.submit(request=completion("nobody", max_tokens=200)))
            await asyncio.wait_for(enqueuing.wait(), 10)
            await until_sent(link._redis())
            late = busy.over()
            task.cancel()
            [result] = await asyncio.gather(task, return_exceptions=True)
            if late:  # Redis may have answered first: try again
                early += 1
                if isinstance(result, JobHandle):
                    await link.cancel(result)
                return False
            assert isinstance(result, asyncio.CancelledError), result  # cancelled with its submit in flight
            return True

        busy = await under_spin(redis_server.port, cancel_while_submitted)
        assert link.open == set() and link.inflight == {}
        await asyncio.to_thread(busy.join)
        deadline = time.monotonic() + 10
        while True:
            queued = [await client.zcard(f"{prefix}q:{c}") for c in range(N_CLASSES)]
            running = await client.zcard(f"{prefix}leases")
            if not any(queued) and not running and not worker.link.held:
                break
            assert time.monotonic() < deadline, (queued, running)
            await asyncio.sleep(0.02)
        assert worker.worker.stats["requests_total"] - served <= 1 + early  # at most started, then cancelled
        assert not [k async for k in client.scan_iter(f"{prefix}job:*")]
    finally:
        if busy is not None:
            await asyncio.to_thread(busy.join)
        admin.close()
        await client.aclose()
        await link.stop()
        worker.stop()


async def test_worker_restarts_counts_each_new_worker_process_not_each_lost_job(redis_server: RedisServer, prefix: str) -> None:
    """superfluid_worker_restarts_total is "times a new engine worker process said hello". A
    head counted each job that lost its worker instead (one crash holding eight of its jobs
    counted eight), and again when the fleet's first worker changed pid."""
    first = SimFleetWorker(redis_server.url, prefix).start()
    link = await head(redis_server.url, prefix)
    later: list[SimFleetWorker] = []
    try:

        async def sees(ids: set[str]) -> None:
            for _ in range(200):
                if set(link.workers) == ids:
                    return
                await asyncio.sleep(0.02)
            raise AssertionError(f"the head sees {sorted(link.workers)}, not {sorted(ids)}")

        await sees({first.link.worker_id})
        assert link.worker_restarts == 0  # there when the head started
        later.append(SimFleetWorker(redis_server.url, prefix).start())
        await sees({first.link.worker_id, later[0].link.worker_id})
        assert link.worker_restarts == 1
        first.stop()  # the first worker goes; its replacement starts
        later.append(SimFleetWorker(redis_server.url, prefix).start())
        await sees({later[0].link.worker_id, later[1].link.worker_id})
        assert link.worker_restarts == 2
    finally:
        await link.stop()
        first.stop()
        for worker in later:
            worker.stop()


async def test_a_worker_that_stalled_and_came_back_is_not_counted_as_a_restart(
    redis_server: RedisServer, prefix: str
) -> None:
    """A worker whose snapshot key lapsed (a stall longer than its lease, or Redis restarted
    empty) and that publishes it again under the same id is the same process: the head counted
    it in superfluid_worker_restarts_total as a new one each time it reappeared."""
    worker = SimFleetWorker(redis_server.url, prefix).start()
    link = await head(redis_server.url, prefix)
    client = redis.Redis(port=redis_server.port)
    wid = worker.link.worker_id

    async def until(seen: bool) -> None:
        for _ in range(500):  # bounds a hang only
            if (wid in link.workers) == seen:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"the head {'never' if seen else 'still'} sees worker {wid}")

    try:
        await until(True)
        assert link.worker_restarts == 0
        for _ in range(2):
            worker.link._publish_snapshot = lambda: None  # type: ignore[method-assign]  # it stalls
            client.delete(prefix + "worker:" + wid)  # and its snapshot lapses
            await until(False)
            del worker.link._publish_snapshot  # it goes on
            await until(True)
        assert link.worker_restarts == 0
    finally:
        client.close()
        await link.stop()
        worker.stop()


async def test_the_wait_in_the_redis_queue_counts_in_a_jobs_queue_wait_and_ttft(redis_server: RedisServer, prefix: str) -> None:
    """In Redis mode a job's queue wait and time to first token (its Done timing, the activity
    row, the worker's histograms) counted from when a worker took it from the Redis queue: a
    job that waited there half a second for the only lane showed ~0 ms. They count from when its
    head queued it now (Redis's clock at both ends)."""
    worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.01, lanes=1))  # ~0.6 s for the first job's 60 tokens
    async with fleet(redis_server.url, prefix, worker) as (worker, link):
        first = await link.submit(request=completion("first", max_tokens=60))
        deadline = time.monotonic() + 10
        while first.delivered_tokens == 0:  # the first holds the only lane, 59 calls of 10 ms to go
            assert time.monotonic() < deadline, "the first job never started"
            await asyncio.sleep(0.005)
        second = await link.submit(request=completion("second", max_tokens=5))
        _text, done_first = await outcome(first)
        _text, done_second = await outcome(second)
        assert isinstance(done_first, Done) and isinstance(done_second, Done)
        waited = done_second.timing["queue_wait_ms"]
        assert waited >= 300, done_second.timing  # it waited for the first's lane, in Redis
        assert done_second.timing["ttft_ms"] >= waited
        assert done_second.timing.get("waited_ms", 0) > 0  # counted by the worker: the row adds nothing


class _ServesSupervisor:
    """serve's worker supervisor over a sim worker on a thread: ``drain()`` is its SIGTERM."""

    def __init__(self, fleet_worker: SimFleetWorker) -> None:
        self.fleet_worker = fleet_worker
        self.exited = threading.Event()

    def drain(self) -> None:
        self.fleet_worker.worker.drain()

        def wait() -> None:
            self.fleet_worker.thread.join()
            self.exited.set()

        threading.Thread(target=wait, daemon=True).start()


async def test_serves_drain_runs_the_jobs_its_head_accepted_that_still_wait_in_the_redis_queue(
    redis_server: RedisServer, prefix: str
) -> None:
    """SIGTERM on ``serve --redis`` with its own worker (the fleet's only one) running a job and
    two more this head accepted waiting in the Redis queue: the worker was told to drain at once,
    stopped pulling, and left the two to end 503 at the drain deadline. The worker is told once
    every job the head accepted has ended; all three run to their end."""
    from scheduler.link.redis_transport import N_CLASSES
    from scheduler.management.commands.serve import Drain

    fleet_worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.01, lanes=1)).start()
    link = await head(redis_server.url, prefix)
    supervisor = _ServesSupervisor(fleet_worker)
    client = redis.Redis(port=redis_server.port)
    try:
        handles = [await link.submit(request=completion(f"job {i}", max_tokens=20)) for i in range(3)]
        endings = [asyncio.ensure_future(outcome(h)) for h in handles]
        deadline = time.monotonic() + 20  # bounds a hang only
        while not (fleet_worker.link.held and sum(client.zcard(f"{prefix}q:{c}") for c in range(N_CLASSES)) == 2):
            assert time.monotonic() < deadline, "the first job never ran with the other two queued"
            await asyncio.sleep(0.01)
        drain = Drain(supervisor, lambda: [link], drain_timeout_s=60.0)  # type: ignore[arg-type]
        drain.begin()
        assert link.draining
        while (state := drain.step()) == "wait":
            assert not (supervisor.exited.is_set() and link.inflight), (
                "the worker left with accepted jobs still queued in Redis"
            )
            assert time.monotonic() < deadline, f"still waiting: {[e.done() for e in endings]}"
            for handle, ending in zip(handles, endings, strict=True):
                if ending.done() and handle.job_id in link.open:
                    link.finish(handle)  # its response was written
            await asyncio.sleep(0.02)
        assert state == "done"
        assert [type(e.result()[1]).__name__ for e in endings] == ["Done"] * 3
        assert all(len(e.result()[0]) > 0 for e in endings)
    finally:
        client.close()
        await link.stop()
        fleet_worker.stop()


async def test_a_head_keeps_nothing_of_a_job_once_it_is_answered(redis_server: RedisServer, prefix: str) -> None:
    """A long-running head kept an entry per job it ever queued (``_epochs``, written at each
    enqueue and never read or removed): memory that grew with every request. Once its jobs are
    answered and finished, none of the link's maps or sets names any of them."""
    async with fleet(redis_server.url, prefix) as (_worker, link):  # a worker of two lanes
        handles = [await link.submit(request=completion(f"job {i}", max_tokens=2)) for i in range(6)]
        await answer_each(link, handles)
        deadline = time.monotonic() + 20  # bounds a hang only
        while link._readers or link._forgetting:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        ids = {h.job_id for h in handles}
        kept = {name: ids & set(value) for name, value in vars(link).items() if isinstance(value, (dict, set))}
        assert {name: found for name, found in kept.items() if found} == {}


async def test_with_no_worker_left_the_dashboard_and_metrics_say_so_instead_of_the_last_ones_lanes(
    redis_server: RedisServer, prefix: str
) -> None:
    """The head's snapshot is what the dashboard draws and /metrics reads. When the fleet's
    last worker went, the head stopped publishing, so both went on showing the dead worker's
    busy lanes and a fleet of one, for as long as no worker came back."""
    from api.metrics import fleet_families, snapshot_families
    from scheduler.link.transport import SNAPSHOT_LISTENERS

    # 10 ms a token: the job is still running for several of the worker's snapshot periods
    worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.01)).start()
    link = await head(redis_server.url, prefix)
    pushed: list[dict[str, Any]] = []
    SNAPSHOT_LISTENERS.append(pushed.append)
    try:
        handle = await link.submit(request=completion("busy", max_tokens=400))
        deadline = time.monotonic() + 20
        while not (link.snapshot and any(lane.get("job_id") for lane in link.snapshot.get("lanes", []))):
            assert time.monotonic() < deadline, "the job never showed in a lane"
            await asyncio.sleep(0.02)
        redis.Redis.from_url(redis_server.url).delete(prefix + "worker:" + worker.link.worker_id)
        worker.link._publish_snapshot = lambda: None  # type: ignore[method-assign]  # it is gone
        for _ in range(200):
            if link.snapshot is not None and not link.snapshot.get("fleet"):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError(f"the head still shows {link.snapshot and link.snapshot.get('fleet')}")
        assert link.snapshot["lanes"] == [] and pushed[-1] is link.snapshot  # the open dashboards hear it
        samples = {s.name: s.value for fam in snapshot_families(link.snapshot) for s in fam.samples if not s.labels}
        assert samples["superfluid_fleet_workers"] == 0
        assert not list(fleet_families({}))  # not in Redis mode: no fleet families at all
        await link.cancel(handle)
    finally:
        SNAPSHOT_LISTENERS.remove(pushed.append)
        vars(worker.link).pop("_publish_snapshot", None)
        await link.stop()
        worker.stop()


async def until_queued(client: redis.Redis, prefix: str, job_id: str, timeout_s: float = 20.0) -> None:
    """Wait until the job is in the Redis queue (state ``q``); the timeout only bounds a hang."""
    deadline = time.monotonic() + timeout_s
    while client.hget(f"{prefix}job:{job_id}", "state") != b"q":
        assert time.monotonic() < deadline, client.hgetall(f"{prefix}job:{job_id}")
        await asyncio.sleep(0.01)


async def test_a_job_picked_as_its_worker_began_to_drain_goes_back_to_the_queue_for_another_worker(
    redis_server: RedisServer, prefix: str
) -> None:
    """A worker's pull loop that passed its draining check just before SIGTERM picked a job and
    handed it to a worker that then refused it: the client got 503 ``shutting_down`` although
    the fleet had other workers. The job now goes back to its place in the queue, unrun, and
    another worker serves it in full."""

    # the long job takes ~3 s of steps, more on a loaded machine: the drain's bound is a failsafe
    # here, not the 5 s that cut it short under CI's load (Error "shutdown" instead of its Done)
    draining = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.01), drain_timeout_s=120.0).start()
    link = await head(redis_server.url, prefix)
    client = redis.Redis(port=redis_server.port)
    spare: SimFleetWorker | None = None
    try:
        long = await link.submit(request=completion("long", max_tokens=300))
        while not isinstance(await long.next_event(), Delta):
            pass
        draining.worker.drain()  # SIGTERM: its pull loop takes nothing more from here on
        late = await link.submit(request=completion("late", max_tokens=12))
        await until_queued(client, prefix, late.job_id)
        # ... but one pick had passed that check already: it lands now, on a free lane
        await asyncio.to_thread(draining.link._pull_once, draining.worker.engine.n_lanes)
        await until_queued(client, prefix, late.job_id)  # given back
        assert client.hget(f"{prefix}job:{late.job_id}", "epoch") == b"1"  # it was picked once
        assert late.job_id not in draining.link.held
        spare = SimFleetWorker(redis_server.url, prefix).start()
        text, done = await outcome(late)
        assert isinstance(done, Done), done
        assert done.usage["completion_tokens"] == 12 and len(text) == 12
        assert spare.worker.stats["requests_total"] == 1
        _text, long_done = await outcome(long)
        assert isinstance(long_done, Done)  # the draining worker finished what it had started
    finally:
        client.close()
        await link.stop()
        draining.stop()
        if spare is not None:
            spare.stop()


async def test_a_drained_worker_leaving_gives_back_the_jobs_it_picked_but_never_started(redis_server: RedisServer, prefix: str) -> None:
    """A pick that lands after the drained worker's loop has ended leaves the job in the link's
    hands only; the worker leaving used to keep it leased until the lease lapsed, and a head
    then counted the loss against the job (two such and it failed ``engine_crashed``). It goes
    back to the queue unrun and unmarked."""
    idle = SimFleetWorker(redis_server.url, prefix)
    idle.worker.drain()  # its loop never runs: what is picked stays in its inbox
    idle.link.start()
    link = await head(redis_server.url, prefix)
    client = redis.Redis(port=redis_server.port)
    spare: SimFleetWorker | None = None
    try:
        handle = await link.submit(request=completion("unstarted", max_tokens=8))
        await until_queued(client, prefix, handle.job_id)
        await asyncio.to_thread(idle.link._pull_once, idle.worker.engine.n_lanes)
        assert handle.job_id in idle.link.held
        await asyncio.to_thread(idle.link.close)
        assert client.hget(f"{prefix}job:{handle.job_id}", "state") == b"q"
        spare = SimFleetWorker(redis_server.url, prefix).start()
        text, done = await outcome(handle)
        assert isinstance(done, Done) and done.usage["completion_tokens"] == 8, done
        assert handle.crashes == 0
    finally:
        client.close()
        await link.stop()
        if spare is not None:
            spare.stop()


async def test_a_request_that_reaches_the_link_after_serves_drain_began_is_refused_there(redis_server: RedisServer, prefix: str) -> None:
    """The consumer checks the drain before its awaits (parsing, admission); a SIGTERM landing
    in them let the job reach the Redis queue after serve had told its worker to drain, and the
    client waited for the drain deadline. The link refuses it as the consumer would have."""
    from scheduler.link.messages import SHUTTING_DOWN, Rejected
    from scheduler.link.redis_transport import N_CLASSES

    worker = SimFleetWorker(redis_server.url, prefix).start()
    link = await head(redis_server.url, prefix)
    client = redis.Redis(port=redis_server.port)
    try:
        link.draining = True
        handle = await link.submit(request=completion("too late", max_tokens=8))
        _text, end = await outcome(handle, timeout_s=5)
        assert isinstance(end, Rejected) and end.reason == SHUTTING_DOWN
        assert not link.inflight and not link.open
        assert sum(client.zcard(f"{prefix}q:{c}") for c in range(N_CLASSES)) == 0
        assert worker.worker.stats["requests_total"] == 0
    finally:
        client.close()
        await link.stop()
        worker.stop()
