"""A fleet head's context and lane caps are the fleet's, not its first worker's (by id): the
context requests are checked against and /v1/models advertises is one every worker can hold, and
the dashboard's header and Queue panel caps describe the whole fleet."""

from __future__ import annotations

import json
from typing import Any

import redis

from dashboard.feed import dashboard_state
from scheduler.link.redis_transport import RedisTransport

from .conftest import RedisServer
from .test_fleet_view_s46 import fleet_head, worker_state


def publish_worker(client: redis.Redis, prefix: str, wid: str, state: dict[str, Any]) -> None:
    client.set(prefix + "worker:" + wid, json.dumps({**state, "worker": wid}), px=60_000)
    client.sadd(prefix + "workers", wid)


async def test_a_fleet_of_different_contexts_checks_requests_against_the_one_every_worker_holds(redis_server: RedisServer, client: redis.Redis, prefix: str) -> None:
    # the first worker by id has 4096 tokens a lane, the other 1024 (a rolling --ctx-size change)
    publish_worker(client, prefix, "a", worker_state("h1", [None], {}, lane_ctx=4096))
    publish_worker(client, prefix, "b", worker_state("h2", [None], {}, lane_ctx=1024))
    link = RedisTransport(redis_server.url, prefix=prefix)
    try:
        await link._tick()
        assert link.connected and link.hello is not None
        # was 4096 (/v1/models, /props): a request of 2000 tokens was a 400 whenever worker b took it
        assert link.hello.lane_ctx == 1024
        assert link.snapshot is not None
        assert dashboard_state(link.snapshot)["lane_ctx"] == 1024  # the header's context
        assert [lane["lane_ctx"] for lane in link.snapshot["lanes"]] == [4096, 1024]  # each lane its own
    finally:
        await link.stop()


def test_the_queue_panels_class_caps_are_the_fleets() -> None:
    a = {**worker_state("h1", [None, None], {}), "class_lanes": {"background": 1}}
    b = worker_state("h2", [None, None, None, None], {})  # no cap: all of its 4 lanes
    c = {**worker_state("h3", [None, None], {}), "class_lanes": {"background": 1, "agent": 2}}
    link: RedisTransport = fleet_head({"a": a, "b": b, "c": c}, {})
    assert link.snapshot is not None
    # was the first worker's {"background": 1}: the fleet runs up to 6 background jobs at once
    assert dashboard_state(link.snapshot)["class_lanes"] == {"agent": 8, "background": 6}
