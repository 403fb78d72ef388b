"""A client whose head died goes on with its stream on another head (``Last-Event-ID``), at the
link: the second head attaches to the job's Redis Stream, sees every event again in order, and
takes the job over, so a worker lost after the first head died still resumes it."""

from __future__ import annotations

import asyncio

from scheduler.link.messages import Delta, Done
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
    texts: list[str] = []
    while True:
        event = await asyncio.wait_for(handle.next_event(), 30)
        if isinstance(event, Delta):
            texts.append(event.text)
        elif isinstance(event, Done):
            link.finish(handle)
            return texts[seen:], event
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
    assert spare.worker.stats["requests_total"] == 1
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
