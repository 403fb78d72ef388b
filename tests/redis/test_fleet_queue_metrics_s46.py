"""A fleet head's queue metrics by band and the oldest waits count the jobs waiting in Redis, as
superfluid_queue_depth does. They were the workers' own queues only: an alert on the seed's
llamaswap_scheduler_queue_depth{band} or on an oldest wait never saw the jobs waiting in Redis,
where most of a fleet's waiting is."""

from __future__ import annotations

import json
from typing import Any

import redis

from scheduler.link.messages import Submit
from scheduler.link.redis_transport import RedisTransport

from .conftest import RedisServer
from .test_fleet_view_s46 import worker_state


def samples(state: dict[str, Any], name: str, label: str) -> dict[str, float]:
    from api.metrics import snapshot_families

    return {s.labels[label]: s.value for fam in snapshot_families(state) for s in fam.samples if s.name == name}


def publish_worker(client: redis.Redis, prefix: str, wid: str, state: dict[str, Any]) -> None:
    client.set(prefix + "worker:" + wid, json.dumps({**state, "worker": wid}), px=60_000)
    client.sadd(prefix + "workers", wid)


async def test_queue_depth_by_band_and_oldest_waits_count_the_jobs_waiting_in_redis(redis_server: RedisServer, client: redis.Redis, prefix: str) -> None:
    worker = worker_state("h1", ["j1", "j2"], {"agent": 1})
    # its own queue: one agent job of the normal band, queued 2 s ago
    worker["metrics"].update(
        queue_oldest_wait_s_by_class={"interactive": 0.0, "completion": 0.0, "agent": 2.0, "background": 0.0},
        queue_depth_by_band={"interactive": 0, "normal": 1, "batch": 0},
        queue_oldest_wait_s_by_band={"interactive": 0.0, "normal": 2.0, "batch": 0.0},
    )
    publish_worker(client, prefix, "w1", worker)
    link = RedisTransport(redis_server.url, prefix=prefix)
    try:
        # in Redis: one request of two choices (normal band, agent class), a batch job that had
        # waited 5 s before its head queued it, and an interactive one
        await link._enqueue(Submit("a1", request={}, qos=2, priority=0), requeue=False, expect_epoch=-1)
        await link._enqueue(Submit("a2", request={}, qos=2, priority=0, request_of="a1"), requeue=False, expect_epoch=-1)
        await link._enqueue(Submit("b1", request={}, qos=3, priority=-100, waited_ms=5000), requeue=False, expect_epoch=-1)
        await link._enqueue(Submit("i1", request={}, qos=0, priority=100), requeue=False, expect_epoch=-1)
        seconds, micros = client.time()
        client.hset(prefix + "job:a1", "arrival", seconds * 1000 + micros // 1000 - 30_000)  # it arrived 30 s ago
        await link._tick()
        state = link.snapshot
        assert state is not None
        depth = samples(state, "llamaswap_scheduler_queue_depth", "band")
        assert depth == {"interactive": 1.0, "normal": 2.0, "batch": 1.0}  # was the worker's: 0, 1, 0
        band_wait = samples(state, "llamaswap_scheduler_queue_oldest_wait_seconds", "band")
        assert 30 <= band_wait["normal"] < 300 and 5 <= band_wait["batch"] < 300  # were 2 and 0
        class_wait = samples(state, "superfluid_queue_oldest_wait_seconds", "class")
        assert 30 <= class_wait["agent"] < 300 and 5 <= class_wait["background"] < 300  # were 2 and 0
        assert samples(state, "superfluid_queue_depth", "class")["agent"] == 3.0  # as before: 2 in Redis, 1 at the worker

        # every worker gone: the jobs in Redis are still counted
        client.srem(prefix + "workers", "w1")
        client.delete(prefix + "worker:w1")
        await link._tick()
        state = link.snapshot
        assert state is not None and state["fleet"] == []
        assert samples(state, "llamaswap_scheduler_queue_depth", "band") == {"interactive": 1.0, "normal": 1.0, "batch": 1.0}
        assert samples(state, "superfluid_queue_oldest_wait_seconds", "class")["agent"] >= 30
    finally:
        await link.stop()


async def test_a_job_put_back_after_its_worker_was_lost_waits_from_when_it_was_put_back(redis_server: RedisServer, client: redis.Redis, prefix: str) -> None:
    publish_worker(client, prefix, "w1", worker_state("h1", [None], {}))
    link = RedisTransport(redis_server.url, prefix=prefix)
    try:
        submit = Submit("r1", request={}, qos=2, priority=0)
        await link._enqueue(submit, requeue=False, expect_epoch=-1)
        seconds, micros = client.time()
        now_ms = seconds * 1000 + micros // 1000
        # it arrived an hour ago, ran, and its worker was lost: put back now, as a preempted job
        client.hset(prefix + "job:r1", mapping={"arrival": now_ms - 3_600_000, "state": "lost"})
        client.zrem(prefix + "q:2", client.hget(prefix + "job:r1", "member"))
        await link._enqueue(submit, requeue=True, expect_epoch=0)
        await link._tick()
        assert link.snapshot is not None
        assert samples(link.snapshot, "superfluid_queue_oldest_wait_seconds", "class")["agent"] < 600
    finally:
        await link.stop()


async def test_a_head_reads_the_queued_jobs_only_while_some_wait_and_at_most_once_a_second(redis_server: RedisServer, client: redis.Redis, prefix: str) -> None:
    """queued.lua reads a field of every queued job while Redis runs nothing else: every head's
    poll (four a second) reading a long queue held Redis that long each time. It runs only while
    some job waits in Redis, and at most once a second (QUEUED_READ_EVERY_S)."""
    publish_worker(client, prefix, "w1", worker_state("h1", [None], {}))
    link = RedisTransport(redis_server.url, prefix=prefix)
    calls = 0
    try:
        real = link.scripts.queued

        async def counted(args: list[Any]) -> Any:
            nonlocal calls
            calls += 1
            return await real(args)

        link.scripts.queued = counted  # type: ignore[method-assign]
        await link._tick()
        await link._tick()
        assert calls == 0  # an empty queue: nothing read
        await link._enqueue(Submit("q1", request={}, qos=2, priority=0), requeue=False, expect_epoch=-1)
        for _ in range(3):  # three polls within a second
            await link._tick()
        assert calls == 1
        assert link.snapshot is not None and samples(link.snapshot, "llamaswap_scheduler_queue_depth", "band")["normal"] == 1.0
    finally:
        await link.stop()
