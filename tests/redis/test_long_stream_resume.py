"""A long reply's stream resumed on another head (Last-Event-ID): the resuming head reads the
job's Redis Stream from its start and skips the deltas its client already has, so every delta
must still be there. A reply may have as many deltas as its lane has context (``--ctx-size``,
any size), one a token."""

from __future__ import annotations

import asyncio
import json

import redis

from scheduler.engines.sim import SimEngine
from scheduler.link.messages import Accepted, Delta, Done
from scheduler.link.redis_transport import LEASE_MS, NO_FLOOR, STREAM_TTL_S, RedisTransport

from .conftest import RedisServer, SimFleetWorker


async def test_a_stream_longer_than_twenty_thousand_deltas_is_resumed_with_every_delta(redis_server: RedisServer, prefix: str, client: redis.Redis) -> None:
    fleet = SimFleetWorker(redis_server.url, prefix, engine=SimEngine(n_lanes=1, lane_ctx=32768))  # not started: driven here
    link = fleet.link
    job_id = "long"
    data = json.dumps({"type": "submit", "id": job_id, "request": {}, "qos": 0, "priority": 0})
    assert int(link.scripts.enqueue([prefix, job_id, 0, 0, 60.0, data, "gone-head", 0, -1, 0])) == 0
    reply = link.scripts.pick([prefix, link.worker_id, 1, 0, LEASE_MS, NO_FLOOR, 8, 8, 8, 8, 0, 0, 0, 0])
    conn = link._conn_cls(job_id, int(reply[1]))
    link.held[job_id] = conn
    n = 25_000  # a 25k-token reply, a delta a token: its lane has 32k of context
    conn.queue(Accepted(job_id, prompt_tokens=3))
    for i in range(n):
        conn.queue(Delta(job_id, f"{i} ", tokens=i + 1))
        if i % 1000 == 999:  # the worker's flushes, a batch at a time
            link.flush()
    conn.queue(Done(job_id, "length"))
    link.flush()
    assert job_id not in link.held and not client.exists(f"{prefix}job:{job_id}")  # all sent, the job ended
    client.set(f"{prefix}r:{job_id}", json.dumps({"id": "chatcmpl-x"}), ex=STREAM_TTL_S)  # the first head's note

    second = RedisTransport(redis_server.url, prefix=prefix, poll_s=0.2)
    try:
        attached = await second.attach(job_id)
        if attached is None:  # refusing the resume (404) would be honest too; a wrong text is not
            return
        handle, _meta = attached
        texts: list[str] = []
        while True:
            event = await asyncio.wait_for(handle.next_event(), 30)
            if isinstance(event, Done):
                break
            if isinstance(event, Delta):
                texts.append(event.text)
        second.finish(handle)
        # a client that had seen the first 100 deltas gets the rest: delta 100 onwards
        assert len(texts) == n and texts[100] == "100 "
    finally:
        await second.stop()


async def test_a_heads_lost_marker_on_a_long_stream_trims_none_of_it(redis_server: RedisServer, prefix: str, client: redis.Redis) -> None:
    fleet = SimFleetWorker(redis_server.url, prefix, engine=SimEngine(n_lanes=1, lane_ctx=32768))  # not started: driven here
    link = fleet.link
    job_id = "long"
    data = json.dumps({"type": "submit", "id": job_id, "request": {}, "qos": 0, "priority": 0})
    link.scripts.enqueue([prefix, job_id, 0, 0, 60.0, data, "gone-head", 0, -1, 0])
    reply = link.scripts.pick([prefix, link.worker_id, 1, 0, LEASE_MS, NO_FLOOR, 8, 8, 8, 8, 0, 0, 0, 0])
    conn = link._conn_cls(job_id, int(reply[1]))
    link.held[job_id] = conn
    for i in range(25_000):
        conn.queue(Delta(job_id, f"{i} ", tokens=i + 1))
        if i % 1000 == 999:
            link.flush()
    link._publish_snapshot()  # the worker is in the fleet, with its lane context
    client.zadd(f"{prefix}leases", {job_id: 0})  # then it dies: its lease lapses
    head = RedisTransport(redis_server.url, prefix=prefix, poll_s=0.2)
    try:
        await head._tick()  # reaps it: the lost marker goes on its stream
        assert client.hget(f"{prefix}job:{job_id}", "state") == b"lost"
        assert client.xlen(f"{prefix}s:{job_id}") == 25_001
    finally:
        await head.stop()
