"""A client whose head died goes on with its stream on another head (``Last-Event-ID``), at the
link: the second head attaches to the job's Redis Stream, sees every event again in order, and
takes the job over, so a worker lost after the first head died still resumes it."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis

from scheduler.engines.sim import SimEngine
from scheduler.link.messages import Delta, Done, Error
from scheduler.link.redis_transport import RedisTransport

from .conftest import RedisServer, SimFleetWorker, completion, head, outcome
from .test_fleet_sim import CrashingSim, slow_sim


async def deltas_until(handle, count: int) -> list[str]:  # type: ignore[no-untyped-def]
    texts: list[str] = []
    while len(texts) < count:
        event = await asyncio.wait_for(handle.next_event(), 30)
        if isinstance(event, Delta):
            texts.append(event.text)
    return texts


async def rest_after(link: RedisTransport, job_id: str, seen: int) -> tuple[list[str], Done]:
    """What a resuming head sends: the deltas after the first ``seen``, then Done."""
    attached = await link.attach(job_id)
    assert attached is not None
    handle, meta = attached
    assert meta["id"] == "chatcmpl-x"
    texts, done = await texts_until_done(handle)
    link.finish(handle)
    return texts[seen:], done


async def texts_until_done(handle: Any) -> tuple[list[str], Done]:
    """The texts of a stream's deltas up to its Done (an ``accepted`` note may come between)."""
    texts: list[str] = []
    while True:
        event = await asyncio.wait_for(handle.next_event(), 30)
        if isinstance(event, Delta):
            texts.append(event.text)
        elif isinstance(event, Done):
            return texts, event
        else:
            assert event.type == "accepted", event


async def test_a_stream_begun_on_a_head_that_died_is_finished_by_another_exactly(redis_server: RedisServer, prefix: str) -> None:
    worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.005)).start()
    first, second = await head(redis_server.url, prefix), await head(redis_server.url, prefix)
    reference, _ = await outcome(await first.submit(request=completion("a tale", max_tokens=60)))

    handle = await first.submit(request=completion("a tale", max_tokens=60))
    await first.remember_stream(handle.job_id, {"id": "chatcmpl-x"})
    got = await deltas_until(handle, 5)
    await first.stop()  # the head dies: nothing cancels the job

    rest, done = await rest_after(second, handle.job_id, len(got))
    assert "".join(got + rest) == reference  # nothing repeated, nothing lost
    assert done.usage["completion_tokens"] == 60
    for _ in range(100):  # the stream is gone once answered (deleted by a task finish() starts)
        if await second.stream_meta(handle.job_id) is None:
            break
        await asyncio.sleep(0.05)
    assert await second.stream_meta(handle.job_id) is None
    assert await second.attach(handle.job_id) is None
    await second.stop()
    worker.stop()


async def test_the_head_that_took_a_stream_over_resumes_it_when_its_worker_dies(redis_server: RedisServer, prefix: str) -> None:
    reference_worker = SimFleetWorker(redis_server.url, prefix).start()
    first = await head(redis_server.url, prefix)
    reference, _ = await outcome(await first.submit(request=completion("story", max_tokens=60)))
    reference_worker.stop()
    reference_worker.link.close()

    doomed = SimFleetWorker(redis_server.url, prefix, engine=CrashingSim(crash_after=40)).start()
    handle = await first.submit(request=completion("story", max_tokens=60))
    await first.remember_stream(handle.job_id, {"id": "chatcmpl-x"})
    got = await deltas_until(handle, 3)
    await first.stop()
    spare = SimFleetWorker(redis_server.url, prefix).start()
    second = await head(redis_server.url, prefix)
    rest, done = await rest_after(second, handle.job_id, len(got))
    assert doomed.error is not None  # the worker did die while the second head had the job
    assert "".join(got + rest) == reference
    # counted by the worker that accepted it; resumed on the spare, not counted again there
    assert (doomed.worker.stats["requests_total"], spare.worker.stats["requests_total"]) == (1, 0)
    await second.stop()
    spare.stop()


async def test_a_stream_noted_right_after_redis_restarted_can_still_be_resumed(prefix: str) -> None:
    """After a Redis restart the head's pooled connection is dead and the next command on it
    fails ("Connection closed by server"). The note another head needs to resume a stream
    (``r:ID``) must survive that: it was lost with a logged warning, and a client whose head
    then died got 404 on resuming (found by the fleet test in CI)."""
    server = RedisServer().start()
    link = RedisTransport(server.url, prefix=prefix)
    try:
        await link.remember_stream("before", {"id": "chatcmpl-1"})
        assert await link.stream_meta("before") == {"id": "chatcmpl-1"}
        server.stop()
        server.start()  # the same port, empty
        await link.remember_stream("after", {"id": "chatcmpl-2"})
        assert await link.stream_meta("after") == {"id": "chatcmpl-2"}
    finally:
        await link.stop()
        server.stop()


async def test_right_after_a_redis_restart_the_links_check_does_not_count_dead_pooled_connections_as_redis_down(prefix: str) -> None:
    """After a Redis restart each idle pooled connection fails once when drawn. The link's
    periodic check drew them one per poll, and each failure flipped it to "unreachable" (503s
    while Redis was up: the fleet test's head answered 503 right after serving again). Its
    client now reconnects and runs a command once more on a connection error."""
    server = RedisServer().start()
    link = RedisTransport(server.url, prefix=prefix, poll_s=600)  # no periodic check: this test runs it
    try:
        await asyncio.gather(*(link._redis().ping() for _ in range(4)))  # four idle connections in the pool
        server.stop()
        server.start()  # the same port, empty
        await link._tick()  # raised "Connection closed by server" before
        await link._tick()
    finally:
        await link.stop()
        server.stop()


class _FailsOnce:
    """The link's scripts, except that the first call of ``name`` raises what a pooled
    connection that died with a Redis restart raises: before Redis ran it ("before"), after
    ("after": its reply was lost), or after and once the job it queued has run to its end
    ("ended": what a fast worker can do before the head's next tick sends the submit again)."""

    def __init__(self, scripts: Any, name: str, *, when: str, url: str = "") -> None:
        self._scripts, self._name, self._when, self._url, self.failed = scripts, name, when, url, False

    def __getattr__(self, name: str) -> Any:
        script = getattr(self._scripts, name)
        if name != self._name or self.failed:
            return script

        async def fail(args: list[Any], client: Any = None) -> Any:
            from redis.exceptions import ConnectionError as RedisConnectionError

            self.failed = True
            if self._when != "before":
                await script(args, client)
            if self._when == "ended":
                await _job_ended(self._url, args[0], args[1])
            raise RedisConnectionError("Connection closed by server.")

        return fail


async def _job_ended(url: str, prefix: str, job_id: str) -> None:
    """Wait until the job's stream holds its last event (a worker's ``done``)."""
    import redis.asyncio as aioredis

    client = aioredis.from_url(url)
    try:
        for _ in range(300):
            entries = await client.xrange(f"{prefix}s:{job_id}")
            if any(b'"type":"done"' in fields.get(b"m", b"") for _, fields in entries):
                return
            await asyncio.sleep(0.02)
        raise AssertionError("the job did not end")
    finally:
        await client.aclose()


async def _nothing_queued_or_running(url: str, prefix: str) -> None:
    """Wait until no job is queued in any class and none is leased to a worker."""
    import redis.asyncio as aioredis

    from scheduler.link.redis_transport import N_CLASSES

    client = aioredis.from_url(url)
    try:
        for _ in range(500):
            counts = [await client.zcard(f"{prefix}q:{c}") for c in range(N_CLASSES)] + [await client.zcard(f"{prefix}leases")]
            if not any(counts):
                return
            await asyncio.sleep(0.02)
        raise AssertionError("jobs still queued or running")
    finally:
        await client.aclose()


@pytest.mark.parametrize("when", ["before", "after", "ended"], ids=["lost-before-redis", "reply-lost", "reply-lost-and-the-job-ended"])
async def test_a_submit_that_fails_while_the_link_is_up_is_sent_again_and_answered_once(redis_server: RedisServer, prefix: str, when: str) -> None:
    """After a Redis restart a head's link is up again, but a submit can still meet a dead
    pooled connection. It used to be marked "send when Redis is back", which for a link that
    already was back meant never: the client waited for nothing until its own timeout (found
    by the fleet test). Now the next tick sends it again. A resend of a submit whose first
    reply was lost is a no-op in Redis, and one whose job has already ended reads that job's
    stream (found by CI: the job ran twice), so the job runs once."""
    worker = SimFleetWorker(redis_server.url, prefix).start()
    link = await head(redis_server.url, prefix)
    try:
        reference, _ = await outcome(await link.submit(request=completion("a tale", max_tokens=20)))
        link._scripts = _FailsOnce(link.scripts, "enqueue", when=when, url=redis_server.url)  # type: ignore[assignment]
        handle = await link.submit(request=completion("a tale", max_tokens=20))
        text, done = await asyncio.wait_for(outcome(handle), 30)
        assert link._scripts.failed  # type: ignore[attr-defined]
        assert text == reference and done.usage["completion_tokens"] == 20
        await _nothing_queued_or_running(redis_server.url, prefix)  # a second run would be by now
        assert worker.worker.stats["requests_total"] == 2  # the reference and this one, once
    finally:
        await link.stop()
        worker.stop()


class _EmitFailsOnce:
    """A worker's Redis client whose pipeline (the flush of every job's events) fails once, the
    way a dead or timed-out connection fails it: before Redis ran it ("before"), after (its
    reply was lost: "after"), or after with redis-py's own retry of the pipeline running the
    same batch a second time ("twice"). ``at`` says which flush: the third, or the one carrying
    the job's ``done``."""

    def __init__(self, client: Any, *, when: str, at: str) -> None:
        self._client, self._when, self._at = client, when, at
        self.flushes = 0
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def pipeline(self, **options: Any) -> Any:
        from redis.exceptions import ConnectionError as RedisConnectionError

        pipe = self._client.pipeline(**options)
        real = pipe.execute

        def execute(raise_on_error: bool = True) -> Any:
            self.flushes += 1
            stack = list(pipe.command_stack)
            done = any(b'"type":"done"' in str(arg).encode() for args, _ in stack for arg in args)
            if not self.failed and (self.flushes == 3 if self._at == "third" else done):
                self.failed = True
                if self._when != "before":
                    real(raise_on_error=raise_on_error)
                    if self._when == "twice":
                        pipe.command_stack = stack
                        return real(raise_on_error=raise_on_error)
                raise RedisConnectionError("Connection closed by server.")
            return real(raise_on_error=raise_on_error)

        pipe.execute = execute
        return pipe


@pytest.mark.parametrize("when", ["before", "after", "twice"], ids=["not-sent", "reply-lost", "retried"])
@pytest.mark.parametrize("at", ["third", "done"], ids=["mid-stream", "the-done"])
async def test_a_flush_of_a_jobs_events_that_fails_is_sent_again_and_appended_once(redis_server: RedisServer, prefix: str, when: str, at: str) -> None:
    """A worker's flush of its jobs' events can fail like any Redis round trip. It used to drop
    the batch (the client never got those tokens, or waited forever for a ``done`` that was
    never sent while the worker kept the job's lease alive), and a batch that redis-py's retry
    sent again after its first reply was lost was appended twice. Now a batch that fails is
    sent again, and Redis appends only what it does not have."""
    worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.002)).start()
    link = await head(redis_server.url, prefix)
    try:
        reference, _ = await outcome(await link.submit(request=completion("a tale", max_tokens=30)))
        failing = _EmitFailsOnce(worker.link.client, when=when, at=at)
        worker.link.client = failing  # type: ignore[assignment]
        text, done = await outcome(await link.submit(request=completion("a tale", max_tokens=30)))
        assert failing.failed
        assert isinstance(done, Done) and done.usage["completion_tokens"] == 30
        assert text == reference  # every token once, in order
        await _nothing_queued_or_running(redis_server.url, prefix)
        for _ in range(250):  # the worker lets the job go at its next flush (a done sent again)
            if not worker.link.held:
                break
            await asyncio.sleep(0.02)
        assert worker.link.held == {}
    finally:
        await link.stop()
        worker.stop()


async def test_a_lost_job_whose_requeue_fails_once_is_requeued_when_its_marker_is_read_again(redis_server: RedisServer, prefix: str) -> None:
    """The head reads a ``lost`` marker and requeues the job; that round trip can fail like any
    other. It used to end the stream's reader with the error, and the client waited for nothing.
    Now the reader reads the marker again and requeues the job, counted as one loss."""
    reference_worker = SimFleetWorker(redis_server.url, prefix).start()
    link = await head(redis_server.url, prefix)
    try:
        reference, _ = await outcome(await link.submit(request=completion("story", max_tokens=60)))
        reference_worker.stop()
        reference_worker.link.close()

        doomed = SimFleetWorker(redis_server.url, prefix, engine=CrashingSim(crash_after=25)).start()
        handle = await link.submit(request=completion("story", max_tokens=60))
        first = await deltas_until(handle, 1)
        link._scripts = _FailsOnce(link.scripts, "enqueue", when="before")  # type: ignore[assignment]
        spare = SimFleetWorker(redis_server.url, prefix).start()
        rest, done = await outcome(handle)
        text = "".join(first) + rest
        assert doomed.error is not None and link._scripts.failed  # type: ignore[attr-defined]
        assert isinstance(done, Done) and done.usage["completion_tokens"] == 60
        assert text == reference  # nothing repeated, nothing lost
        spare.stop()
    finally:
        await link.stop()


async def test_a_job_in_flight_during_two_worker_losses_in_a_row_fails_and_leaves_the_queue(redis_server: RedisServer, prefix: str) -> None:
    """A request that kills every worker it reaches (here each worker dies at its first step,
    before any token) is resumed once, then fails with engine_crashed, and is taken out of Redis:
    a worker that comes later does not run it."""
    link = RedisTransport(redis_server.url, prefix=prefix, poll_s=0.05)
    first = SimFleetWorker(redis_server.url, prefix, engine=CrashingSim(crash_after=1)).start()
    assert await link.wait_connected(20)
    try:
        handle = await link.submit(request=completion("poison", max_tokens=20))
        while first.error is None:
            await asyncio.sleep(0.01)
        second = SimFleetWorker(redis_server.url, prefix, engine=CrashingSim(crash_after=1)).start()
        _text, event = await outcome(handle)
        assert second.error is not None
        assert isinstance(event, Error) and event.reason == "engine_crashed", event
        await _nothing_queued_or_running(redis_server.url, prefix)
        spare = SimFleetWorker(redis_server.url, prefix).start()
        await asyncio.sleep(0.5)  # time to take a job, were one left
        assert spare.worker.stats["requests_total"] == 0
        spare.stop()
    finally:
        await link.stop()


async def test_a_job_given_back_to_the_same_worker_after_it_stalled_past_its_lease_is_finished_exactly(redis_server: RedisServer, prefix: str) -> None:
    """A worker that stalls longer than its lease (a process paused, Redis out of reach) loses
    its job: a head requeues it, and the one worker of the fleet, back, picks it again while its
    stale run is still there. The stale run's fenced emit then released the *new* pick (by id),
    and the new Submit was refused as a duplicate of the stale run, unseen: the lease lapsed
    again and the client got engine_crashed. Now the stale run is stopped by its connection and
    the job resumes from the text delivered."""
    stalled = threading.Event()
    go_on = threading.Event()
    engine = SimEngine(n_lanes=2, lane_ctx=512)

    def on_call(_n: int) -> None:
        time.sleep(0.005)
        if stalled.is_set():
            go_on.wait(30)

    engine.on_call = on_call
    worker = SimFleetWorker(redis_server.url, prefix, engine=engine).start()
    renew = worker.link._renew_once
    worker.link._renew_once = lambda: None if stalled.is_set() else renew()  # type: ignore[method-assign]
    link = await head(redis_server.url, prefix)
    admin = redis.Redis.from_url(redis_server.url)
    try:
        reference, _ = await outcome(await link.submit(request=completion("story", max_tokens=40)))
        handle = await link.submit(request=completion("story", max_tokens=40))
        got = await deltas_until(handle, 3)
        stalled.set()  # the engine's next step and the lease renewals hang
        deadline = time.monotonic() + 20
        while True:  # lapsed (epoch 2), requeued by the head, picked again by this worker (epoch 3)
            epoch, state = admin.hmget(f"{prefix}job:{handle.job_id}", ["epoch", "state"])
            if epoch is not None and int(epoch) >= 3 and state == b"run":
                break
            assert time.monotonic() < deadline, (epoch, state)
            await asyncio.sleep(0.02)
        stalled.clear()
        go_on.set()
        rest, done = await outcome(handle)
        assert isinstance(done, Done), done
        assert done.usage["completion_tokens"] == 40
        assert "".join(got) + rest == reference  # nothing repeated, nothing lost
    finally:
        stalled.clear()
        go_on.set()
        admin.close()
        await link.stop()
        worker.stop()


async def test_a_resumed_stream_keeps_its_key_on_the_head_that_took_it_over(redis_server: RedisServer, prefix: str) -> None:
    """The head a client resumed its stream on showed the keyed request as ``anonymous`` on the
    dashboard's lanes and ``key: null`` in /slots: the handle it attached had no key."""
    worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.005)).start()
    first, second = await head(redis_server.url, prefix), await head(redis_server.url, prefix)
    handle = await first.submit(request=completion("a tale", max_tokens=60))
    handle.key = "ci-bot"
    await first.remember_stream(handle.job_id, {"id": "chatcmpl-x", "key": "ci-bot"})
    await deltas_until(handle, 2)
    await first.stop()
    attached = await second.attach(handle.job_id)
    assert attached is not None
    resumed, _meta = attached
    assert resumed.key == "ci-bot" and second.inflight[handle.job_id].key == "ci-bot"
    await second.cancel(resumed)
    second.finish(resumed)
    await second.stop()
    worker.stop()


async def test_a_job_whose_head_died_stops_running_and_is_resumed_when_its_client_comes_back(redis_server: RedisServer, prefix: str) -> None:
    """A head killed mid-stream left its running job to go on to max_tokens with nobody reading
    it, holding a lane (and its queued jobs after it). Its worker stops it once the head's key
    lapses; a client that comes back to another head still gets the whole reply, exactly."""
    reference_worker = SimFleetWorker(redis_server.url, prefix).start()
    first = RedisTransport(redis_server.url, prefix=prefix, poll_s=0.1, head_ttl_ms=500)
    assert await first.wait_connected(20)
    reference, _ = await outcome(await first.submit(request=completion("a tale", max_tokens=400)))
    reference_worker.stop()
    reference_worker.link.close()

    engine = slow_sim(0.04)
    worker = SimFleetWorker(redis_server.url, prefix, engine=engine).start()
    handle = await first.submit(request=completion("a tale", max_tokens=400))  # 16 s of tokens
    await first.remember_stream(handle.job_id, {"id": "chatcmpl-x"})
    got = await deltas_until(handle, 3)
    await first.stop()  # the head dies: nothing cancels the job
    stopped_by = time.monotonic() + 10  # the key lapses in 0.5 s, renewals every 0.33 s; the job has ~15 s left
    while worker.worker.contexts or worker.link.held:
        assert time.monotonic() < stopped_by, "the job nobody reads still runs"
        await asyncio.sleep(0.05)
    engine.on_call = lambda n: None  # the resumed rest at full speed: it only has to be exact

    second = await head(redis_server.url, prefix)
    rest, done = await rest_after(second, handle.job_id, len(got))
    assert "".join(got + rest) == reference
    assert done.usage["completion_tokens"] == 400
    await second.stop()
    worker.stop()


async def test_a_job_resumed_on_another_head_is_not_stopped_when_the_first_heads_key_lapses(redis_server: RedisServer, prefix: str) -> None:
    worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.01)).start()
    first = RedisTransport(redis_server.url, prefix=prefix, poll_s=0.1, head_ttl_ms=300)
    second = RedisTransport(redis_server.url, prefix=prefix, poll_s=0.1, head_ttl_ms=300)
    for link in (first, second):
        assert await link.wait_connected(20)
    dropped: list[str] = []
    drop = worker.link._drop
    worker.link._drop = lambda conn: (dropped.append(conn.job_id), drop(conn))  # type: ignore[method-assign]

    handle = await first.submit(request=completion("a tale", max_tokens=300))  # ~3 s of tokens
    await first.remember_stream(handle.job_id, {"id": "chatcmpl-x"})
    got = await deltas_until(handle, 3)
    await first.stop()
    rest, done = await rest_after(second, handle.job_id, len(got))  # adopted at once
    assert done.usage["completion_tokens"] == 300
    assert dropped == []  # ran through on its first lane, never stopped and put back
    await second.stop()
    worker.stop()


async def test_a_loss_whose_requeue_reply_was_lost_still_counts_toward_engine_crashed(redis_server: RedisServer, prefix: str) -> None:
    """The head's requeue of a lost job ran in Redis but its reply was lost (a timeout, a dead
    connection): the marker, read again, finds the job queued, not lost. That loss went
    uncounted, so a request that kills every worker it reaches crashed a third one."""
    link = RedisTransport(redis_server.url, prefix=prefix, poll_s=0.05)
    first = SimFleetWorker(redis_server.url, prefix, engine=CrashingSim(crash_after=1)).start()
    assert await link.wait_connected(20)
    second = None
    try:
        handle = await link.submit(request=completion("poison", max_tokens=20))
        link._scripts = _FailsOnce(link.scripts, "enqueue", when="after")  # type: ignore[assignment]
        while first.error is None:
            await asyncio.sleep(0.01)
        second = SimFleetWorker(redis_server.url, prefix, engine=CrashingSim(crash_after=1)).start()
        _text, event = await asyncio.wait_for(outcome(handle), 20)
        assert link._scripts.failed and second.error is not None  # type: ignore[attr-defined]
        assert isinstance(event, Error) and event.reason == "engine_crashed", event
        await _nothing_queued_or_running(redis_server.url, prefix)
    finally:
        await link.stop()
        if second is not None and second.error is None:
            second.stop()
