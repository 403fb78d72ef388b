"""A head's /metrics for a Redis fleet: the whole fleet's counts under the single-worker names,
and counters that never go down when a worker leaves (Prometheus would read a reset there, and
``rate()`` would spike by everything counted so far)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from scheduler.link.fleet_stats import DEPARTED_KEPT, FleetTotals, merge_stats

from .conftest import RedisServer, SimFleetWorker, answer_each, completion, head
from .test_fleet_sim import slow_sim


def hist(counts: list[int], total: float) -> dict[str, Any]:
    return {"le": [0.1, 1.0], "buckets": counts, "sum": total, "count": counts[-1] + 1}


def snapshot(decode: int, lanes: int = 2, oldest: float = 0.0, parks: int = 0, blocks: int = 0, ttft: list[int] | None = None) -> dict[str, Any]:
    return {
        "metrics": {
            "lanes_total": lanes,
            "decode_tokens_total": decode,
            "queue_oldest_wait_s_by_class": {"interactive": oldest},
            "finished": {"interactive": {"stop": decode // 10}},
            "ttft_s": {"interactive": hist(ttft or [0, 0], 0.5)},
            "last_tick": {"tick": decode, "lanes": lanes},
        },
        "counters": {"parks": parks},
        "pool": {"blocks_used": blocks},
    }


def test_the_fleet_adds_up_its_workers_and_keeps_the_largest_wait() -> None:
    metrics, counters, pool = FleetTotals().view({"a": snapshot(100, oldest=0.5, parks=1, blocks=3, ttft=[1, 2]), "b": snapshot(50, lanes=4, oldest=2.0, parks=2, blocks=4, ttft=[0, 1])})
    assert metrics["lanes_total"] == 6 and metrics["decode_tokens_total"] == 150
    assert metrics["queue_oldest_wait_s_by_class"] == {"interactive": 2.0}
    assert metrics["finished"] == {"interactive": {"stop": 15}}
    assert metrics["ttft_s"]["interactive"] == {"le": [0.1, 1.0], "buckets": [1, 3], "sum": 1.0, "count": 5}
    assert metrics["last_tick"] == {"tick": 100, "lanes": 2}  # the first worker's, not a sum
    assert counters == {"parks": 3} and pool == {"blocks_used": 7}


def test_a_worker_that_leaves_keeps_its_counts_and_one_that_comes_back_is_not_counted_twice() -> None:
    totals = FleetTotals()
    totals.view({"a": snapshot(100, parks=1, blocks=3), "b": snapshot(50, parks=2, blocks=4)})
    metrics, counters, pool = totals.view({"b": snapshot(60, parks=2, blocks=4)})  # a left
    assert metrics["decode_tokens_total"] == 160 and counters == {"parks": 3}
    assert metrics["lanes_total"] == 2 and pool == {"blocks_used": 4}  # a gauge leaves with its worker
    assert metrics["finished"] == {"interactive": {"stop": 16}} and metrics["ttft_s"]["interactive"]["count"] == 2
    metrics, counters, _ = totals.view({"a": snapshot(110, parks=1), "b": snapshot(60, parks=2)})  # a stalled and is back
    assert metrics["decode_tokens_total"] == 170 and counters == {"parks": 3}
    metrics, counters, _ = totals.view({})  # no worker left
    assert metrics["decode_tokens_total"] == 170 and counters == {"parks": 3} and "lanes_total" not in metrics


def test_counts_of_workers_long_gone_stay_in_the_sum() -> None:
    totals = FleetTotals()
    for i in range(DEPARTED_KEPT + 5):
        totals.view({f"w{i}": snapshot(10)})
    metrics, _, _ = totals.view({"last": snapshot(10)})
    assert metrics["decode_tokens_total"] == 10 * (DEPARTED_KEPT + 6)


def test_merging_nothing_is_nothing_and_odd_fields_are_the_first_ones() -> None:
    assert merge_stats([]) == {}
    assert merge_stats([{"x": "a", "y": [1]}, {"x": "b", "y": [2], "z": 1}]) == {"x": "a", "y": [1], "z": 1}


def samples(state: Mapping[str, Any]) -> dict[str, float]:
    from api.metrics import snapshot_families

    return {s.name: s.value for fam in snapshot_families(state) for s in fam.samples if not s.labels}


async def test_a_heads_metrics_count_every_workers_tokens_and_never_go_down_when_one_leaves(redis_server: RedisServer, prefix: str) -> None:
    """Before, a head's worker families were the first worker's (by id): half the fleet's
    tokens, and when that worker left, the other's totals in their place."""
    workers = [SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.002)).start() for _ in range(2)]
    link = await head(redis_server.url, prefix)
    try:
        handles = [await link.submit(request=completion(f"prompt {i}", max_tokens=20)) for i in range(8)]
        await answer_each(link, handles)
        served = [w.worker.stats["requests_total"] for w in workers]
        assert all(n > 0 for n in served), served  # both workers took jobs

        async def until(check: Any, what: str) -> dict[str, float]:
            deadline = time.monotonic() + 20
            while True:
                seen = samples(link.snapshot or {})
                if check(seen):
                    return seen
                assert time.monotonic() < deadline, f"{what}: {seen}"
                await asyncio.sleep(0.05)

        seen = await until(lambda s: s.get("superfluid_completion_tokens_total") == 160, "the fleet's 160 tokens")
        assert seen["superfluid_lanes_total"] == 4 and seen["superfluid_worker_requests_total"] == 8
        first = min(workers, key=lambda w: w.link.worker_id)
        first.stop()  # drains and leaves the fleet
        seen = await until(lambda s: s.get("superfluid_fleet_workers") == 1, "one worker left")
        assert seen["superfluid_completion_tokens_total"] == 160 and seen["superfluid_worker_requests_total"] == 8
        assert seen["superfluid_lanes_total"] == 2
    finally:
        await link.stop()
        for w in workers:
            w.stop()


def test_histograms_of_workers_with_other_bucket_bounds_count_every_observation_and_never_go_down() -> None:
    """A fleet mid-upgrade: a worker of a version whose bucket bounds differ. Its observations
    count in the fleet's sum and count (bound-free), and its buckets at the bounds both versions
    have; before, the first worker's histogram (by id) stood for the fleet's, so the other's
    observations were dropped, and when the first one left, the count went down (a reset)."""
    old = {"le": [0.1, 0.5, 1.0], "buckets": [1, 2, 3], "sum": 1.5, "count": 4}
    new = {"le": [0.1, 0.25, 1.0, 5.0], "buckets": [10, 20, 30, 40], "sum": 20.0, "count": 50}

    def with_ttft(h: dict[str, Any]) -> dict[str, Any]:
        return {"metrics": {"ttft_s": {"interactive": h}}}

    totals = FleetTotals()
    metrics, _, _ = totals.view({"a": with_ttft(old), "b": with_ttft(new)})
    merged = metrics["ttft_s"]["interactive"]
    assert merged == {"le": [0.1, 1.0], "buckets": [11, 33], "sum": 21.5, "count": 54}
    metrics, _, _ = totals.view({"b": with_ttft(new)})  # the old worker left: carried
    assert metrics["ttft_s"]["interactive"]["count"] == 54 and metrics["ttft_s"]["interactive"]["buckets"] == [11, 33]
