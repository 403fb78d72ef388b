"""A web head's reader of one job's stream (``s:ID``), with the stream written here as a worker
(or a broken or hostile peer with access to Redis) would: its clean-up when the head stops, and
the entries it cannot act on. The head sees a worker through a snapshot key written here; no
worker process runs, so nothing else writes the streams."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis

from scheduler.link.messages import ENGINE_ERROR, Accepted, Delta, Done, Error, encode
from scheduler.link.redis_transport import RedisTransport
from scheduler.link.transport import JobHandle

from .conftest import RedisServer, completion


async def a_head_with_a_pretend_worker(url: str, prefix: str, admin: redis.Redis) -> RedisTransport:
    admin.set(f"{prefix}worker:pretend", json.dumps({"model": "sim", "engine": "sim", "n_lanes": 1, "lane_ctx": 512, "pid": 1, "worker": "pretend"}))
    admin.sadd(f"{prefix}workers", "pretend")
    link = RedisTransport(url, prefix=prefix, poll_s=0.05)
    assert await link.wait_connected(20), "the head did not see the pretend worker"
    return link


def emit(admin: redis.Redis, prefix: str, job_id: str, raw: bytes | str) -> None:
    admin.xadd(f"{prefix}s:{job_id}", {"m": raw})


async def next_event(handle: JobHandle, timeout_s: float = 5.0) -> object:
    return await asyncio.wait_for(handle.next_event(), timeout_s)


async def test_a_reader_that_ends_because_its_head_stopped_still_deletes_its_finished_jobs_stream(redis_server: RedisServer, prefix: str) -> None:
    """A job the web side is done with while its reader waits in XREAD: the reader deletes its
    stream and resume note when the XREAD returns. A head stopped meanwhile made that reader
    leave because of the stop, and its DELETE then found the link stopped and was never sent:
    the stream and the note stayed for their whole TTL (600 s)."""
    admin = redis.Redis.from_url(redis_server.url)
    link = await a_head_with_a_pretend_worker(redis_server.url, prefix, admin)
    try:
        handle = await link.submit(request=completion(max_tokens=5))
        await link.remember_stream(handle.job_id, {"id": "chatcmpl-x"})
        emit(admin, prefix, handle.job_id, encode(Accepted(handle.job_id, prompt_tokens=3)))
        assert isinstance(await next_event(handle), Accepted)
        assert handle.job_id in link._readers
        link.finish(handle)  # the response ended (or was abandoned): the reader's clean-up now
        assert admin.exists(f"{prefix}s:{handle.job_id}", f"{prefix}r:{handle.job_id}") == 2
        await link.stop()  # before the reader's XREAD (a second's block) has returned
        assert not link._readers
        assert admin.exists(f"{prefix}s:{handle.job_id}", f"{prefix}r:{handle.job_id}") == 0
    finally:
        await link.stop()
        admin.close()


async def test_a_lost_marker_with_an_unreadable_epoch_does_not_stop_the_reader_for_good(redis_server: RedisServer, prefix: str) -> None:
    """A ``lost`` marker whose epoch is not a number (written by a broken or hostile peer) raised
    in the reader as if Redis were away: it read the same entry again and again, forever, and
    the job's later entries (its Done) never reached the client."""
    admin = redis.Redis.from_url(redis_server.url)
    link = await a_head_with_a_pretend_worker(redis_server.url, prefix, admin)
    try:
        handle = await link.submit(request=completion(max_tokens=5))
        for bad in ('{"type": "lost", "epoch": "x"}', '{"type": "lost", "epoch": null}', '{"type": "lost", "epoch": [1]}'):
            emit(admin, prefix, handle.job_id, bad)
        emit(admin, prefix, handle.job_id, encode(Accepted(handle.job_id, prompt_tokens=3)))
        emit(admin, prefix, handle.job_id, encode(Done(handle.job_id, "stop", {"completion_tokens": 0})))
        assert isinstance(await next_event(handle), Accepted)
        assert isinstance(await next_event(handle), Done)
    finally:
        await link.stop()
        admin.close()


async def test_an_entry_with_a_field_of_the_wrong_type_is_dropped_and_the_stream_goes_on(redis_server: RedisServer, prefix: str) -> None:
    """A delta whose text is not a string (a broken or hostile peer) raised as the head applied
    it, and the reader, taking that for Redis away, acted on the same entry again forever: the
    client never got the rest of its reply."""
    admin = redis.Redis.from_url(redis_server.url)
    link = await a_head_with_a_pretend_worker(redis_server.url, prefix, admin)
    try:
        handle = await link.submit(request=completion(max_tokens=5))
        emit(admin, prefix, handle.job_id, encode(Accepted(handle.job_id, prompt_tokens=3)))
        emit(admin, prefix, handle.job_id, json.dumps({"type": "delta", "id": handle.job_id, "text": 5, "tokens": 1}))
        emit(admin, prefix, handle.job_id, encode(Delta(handle.job_id, "hi", tokens=1)))
        emit(admin, prefix, handle.job_id, encode(Done(handle.job_id, "stop", {"completion_tokens": 1})))
        assert isinstance(await next_event(handle), Accepted)
        delta = await next_event(handle)
        assert isinstance(delta, Delta) and delta.text == "hi"
        assert isinstance(await next_event(handle), Done)
        assert handle.delivered_text == "hi"
    finally:
        await link.stop()
        admin.close()


@pytest.mark.parametrize("timing", ["5", '{"preemptions": 1e999}'], ids=["not-an-object", "infinite-count"])
async def test_a_done_that_cannot_be_applied_ends_the_job_with_an_error_instead_of_nothing(redis_server: RedisServer, prefix: str, timing: str) -> None:
    """A Done whose timing is not an object, after a worker loss (the head adds the lost
    worker's preemptions to it), raised after the job had left ``inflight``: read again, it
    found no job, and the client waited for an answer that never came. A count of 1e999 (JSON's
    infinity) raised OverflowError, which ended the reader itself."""
    admin = redis.Redis.from_url(redis_server.url)
    link = await a_head_with_a_pretend_worker(redis_server.url, prefix, admin)
    try:
        handle = await link.submit(request=completion(max_tokens=5))
        handle.preemptions_lost = 1  # as after a lost worker had preempted it once
        emit(admin, prefix, handle.job_id, json.dumps({"type": "done", "id": handle.job_id, "finish_reason": "stop", "timing": "TIMING"}).replace('"TIMING"', timing))
        event = await next_event(handle)
        assert isinstance(event, Error) and event.reason == ENGINE_ERROR, event
        assert handle.job_id not in link.inflight
    finally:
        await link.stop()
        admin.close()


async def test_a_lost_worker_after_a_delta_with_a_field_of_the_wrong_type_ends_the_job_with_an_error(redis_server: RedisServer, prefix: str) -> None:
    """A delta whose preemptions is not a number is applied as it is; when that job's worker is
    then lost, putting the job back raised (the lost worker's preemptions are added up) and the
    reader, taking that for Redis away, acted on the lost marker again forever: the client got
    nothing more, neither the job's text nor an error."""
    admin = redis.Redis.from_url(redis_server.url)
    link = await a_head_with_a_pretend_worker(redis_server.url, prefix, admin)
    try:
        handle = await link.submit(request=completion(max_tokens=5))
        emit(admin, prefix, handle.job_id, encode(Accepted(handle.job_id, prompt_tokens=3)))
        emit(admin, prefix, handle.job_id, json.dumps({"type": "delta", "id": handle.job_id, "text": "hi", "tokens": 1, "preemptions": "x"}))
        assert isinstance(await next_event(handle), Accepted)
        assert isinstance(await next_event(handle), Delta)
        # its worker is lost, as reap.lua marks it
        job = f"{prefix}job:{handle.job_id}"
        epoch = int(admin.hget(job, "epoch") or 0) + 1
        admin.hset(job, mapping={"state": "lost", "worker": "", "epoch": epoch})
        emit(admin, prefix, handle.job_id, json.dumps({"type": "lost", "epoch": epoch}))
        event = await next_event(handle)
        assert isinstance(event, Error), event
        assert handle.job_id not in link.inflight
    finally:
        await link.stop()
        admin.close()


async def test_a_worker_snapshot_that_is_not_an_object_does_not_take_the_head_down(redis_server: RedisServer, prefix: str) -> None:
    """Each head reads every worker's snapshot key at every poll. One that is JSON but not an
    object, or an object with a field of the wrong type (a broken or hostile peer), made every
    poll fail, as it came or as that worker left (for good then: the head kept the snapshot to
    carry its counts): the head said Redis was unreachable and answered 503 to every request,
    beside a healthy worker. (The broken one's id sorts first: the head's hello is the first
    worker's.)"""
    admin = redis.Redis.from_url(redis_server.url)
    link = await a_head_with_a_pretend_worker(redis_server.url, prefix, admin)

    async def stays_up(blob: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            assert link.redis_ok and link.connected, f"a snapshot {blob} took the head down"

    try:
        wrong_fields = [{"n_lanes": "x"}, {"pid": None}, {"metrics": [1]}, {"counters": 5}, {"metrics": {"h": {"le": [1], "buckets": [], "sum": 0, "count": 0}}}]
        for blob in ("[]", "5", '"a"', "null", *(json.dumps({"model": "sim", "n_lanes": 1, **bad}) for bad in wrong_fields)):
            connection = link._connection
            admin.set(f"{prefix}worker:broken", blob)
            admin.sadd(f"{prefix}workers", "broken")
            await stays_up(blob, 0.5)
            admin.delete(f"{prefix}worker:broken")  # it leaves
            await stays_up(blob, 0.3)
            assert link._connection == connection
            assert set(link.workers) == {"pretend"}
    finally:
        await link.stop()
        admin.close()


async def test_a_worker_id_that_is_not_utf8_does_not_take_the_head_down(redis_server: RedisServer, prefix: str) -> None:
    """The heads read the worker ids in ``workers`` as text: one that is not UTF-8 (a broken or
    hostile peer's) made every poll fail, and the head answered 503 beside a healthy worker."""
    admin = redis.Redis.from_url(redis_server.url)
    link = await a_head_with_a_pretend_worker(redis_server.url, prefix, admin)
    try:
        for member in (b"\xff\xfe", b"ok:\xc3"):
            admin.sadd(f"{prefix}workers", member)
            admin.set(f"{prefix}worker:".encode() + member, json.dumps({"model": "sim", "n_lanes": 1}))
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                assert link.redis_ok and link.connected, f"a worker id {member!r} took the head down"
            assert len(link.workers) == 2
            admin.delete(f"{prefix}worker:".encode() + member)  # it leaves: its id goes from the set
            deadline = time.monotonic() + 5
            while admin.sismember(f"{prefix}workers", member):
                assert time.monotonic() < deadline, "the id of a worker that left stayed in the set"
                await asyncio.sleep(0.05)
            assert link.redis_ok and link.connected
    finally:
        await link.stop()
        admin.close()
