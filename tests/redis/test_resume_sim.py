"""A client whose head died goes on with its stream on another head (``Last-Event-ID``), at the
link: the second head attaches to the job's Redis Stream, sees every event again in order, and
takes the job over, so a worker lost after the first head died still resumes it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

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


class _FailsOnce:
    """The link's scripts, except that the first call of ``name`` raises what a pooled
    connection that died with a Redis restart raises, whether or not Redis ran it first."""

    def __init__(self, scripts: Any, name: str, *, after_running: bool) -> None:
        self._scripts, self._name, self._after_running, self.failed = scripts, name, after_running, False

    def __getattr__(self, name: str) -> Any:
        script = getattr(self._scripts, name)
        if name != self._name or self.failed:
            return script

        async def fail(args: list[Any], client: Any = None) -> Any:
            from redis.exceptions import ConnectionError as RedisConnectionError

            self.failed = True
            if self._after_running:
                await script(args, client)
            raise RedisConnectionError("Connection closed by server.")

        return fail


@pytest.mark.parametrize("after_running", [False, True], ids=["lost-before-redis", "reply-lost"])
async def test_a_submit_that_fails_while_the_link_is_up_is_sent_again_and_answered_once(redis_server: RedisServer, prefix: str, after_running: bool) -> None:
    """After a Redis restart a head's link is up again, but a submit can still meet a dead
    pooled connection. It used to be marked "send when Redis is back", which for a link that
    already was back meant never: the client waited for nothing until its own timeout (found
    by the fleet test). Now the next tick sends it again, and a resend of a submit whose first
    reply was lost is a no-op in Redis, so the job runs once."""
    worker = SimFleetWorker(redis_server.url, prefix).start()
    link = await head(redis_server.url, prefix)
    try:
        reference, _ = await outcome(await link.submit(request=completion("a tale", max_tokens=20)))
        link._scripts = _FailsOnce(link.scripts, "enqueue", after_running=after_running)  # type: ignore[assignment]
        handle = await link.submit(request=completion("a tale", max_tokens=20))
        text, done = await asyncio.wait_for(outcome(handle), 30)
        assert link._scripts.failed  # type: ignore[attr-defined]
        assert text == reference and done.usage["completion_tokens"] == 20
        assert worker.worker.stats["requests_total"] == 2  # the reference and this one, once
    finally:
        await link.stop()
        worker.stop()
