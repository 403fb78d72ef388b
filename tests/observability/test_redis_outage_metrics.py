"""While a fleet head cannot reach Redis it knows nothing of the fleet: /metrics must not go on
reporting the workers, busy lanes and global queue it last read as the present state."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from api.metrics import link_state
from scheduler.link.redis_transport import RedisTransport
from superfluid_site import runtime as runtime_mod

from .test_lost_worker_metrics import scrape, values

WORKER = {
    "model": "smol",
    "host": "gpu1",
    "n_lanes": 2,
    "lanes": [{"lane": 0, "state": "decode", "job_id": "j1"}, {"lane": 1, "state": "decode", "job_id": "j2"}],
    "metrics": {"lanes_total": 2, "lanes_by_state": {"idle": 0, "prefill": 0, "decode": 2}, "queue_depth_by_class": {"agent": 3}},
    "counters": {"admitted": 40},
    "pool": {"blocks_used": 900, "blocks_total": 1000},
}


async def test_while_redis_is_unreachable_the_fleet_it_last_saw_is_not_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    link = RedisTransport("redis://127.0.0.1:1/0", poll_s=0.01)
    link.workers = {"w1": dict(WORKER), "w2": dict(WORKER)}
    link.global_queue = {"agent": 12}
    link.redis_ok = True
    link._publish_fleet()
    monkeypatch.setattr(runtime_mod, "get_link", lambda: link)
    fams = scrape(monkeypatch, link_state)
    assert values(fams, "superfluid_fleet_workers") == [2]  # Redis answers: the fleet as read

    async def unreachable() -> None:
        raise ConnectionError("Redis away")

    monkeypatch.setattr(link, "_tick", unreachable)
    task = asyncio.get_running_loop().create_task(link._run())
    for _ in range(100):
        await asyncio.sleep(0.01)
        if not link.redis_ok:
            break
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not link.redis_ok and link.snapshot and link.snapshot["fleet"]  # the link keeps what it last read
    fams: dict[str, Any] = scrape(monkeypatch, link_state)
    assert values(fams, "superfluid_worker_connected") == [0]
    assert values(fams, "superfluid_fleet_workers") == []
    assert sum(values(fams, "superfluid_fleet_lanes_busy")) == 0
    assert sum(values(fams, "superfluid_global_queue_depth")) == 0
    assert sum(values(fams, "superfluid_lanes_active")) == 0
    assert sum(values(fams, "superfluid_pool_blocks_used")) == 0
