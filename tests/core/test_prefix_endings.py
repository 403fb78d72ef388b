"""The KV pool's host memory, and prefixes of requests that end at their first token (max_tokens 1, an end of generation): a follower that waited for one, a pin asked for by one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from scheduler.core.kv_pool import KvPool, PoolConfig, PoolOps

from .builders import make_job, make_scheduler, run_until_idle
from .test_prefix_cache import SYSTEM, prefilled_tokens, shared_job


@dataclass
class _Artifact:
    nbytes: int


def _evict_to_host(pool: KvPool, tokens: list[int], nbytes: int, now: float) -> None:
    entry = pool.store(PoolOps(), 0, tokens, now)
    assert entry is not None
    pool.settle({})
    ops = PoolOps()
    pool._evict(ops, entry, now)
    pool.settle({key: _Artifact(nbytes) for _slot, key in ops.evict})


def test_a_prefix_larger_than_the_whole_host_cache_does_not_empty_it() -> None:
    """`--host-cache-mb`: "least recently used dropped beyond it". An evicted prefix bigger than
    the whole host cache can never be kept there: it alone is dropped, not every prefix the
    host cache held before it (which left the cache empty all the same)."""
    pool = KvPool(PoolConfig(n_lanes=1, lane_ctx=256, cache_slots=1, host_cache_bytes=100))
    _evict_to_host(pool, [3] * 40, 40, 1.0)
    _evict_to_host(pool, [4] * 40, 40, 2.0)
    assert sorted(e.tokens[0] for e in pool.host_entries()) == [3, 4]
    _evict_to_host(pool, [5] * 200, 500, 3.0)  # the most recently used, but over the limit alone
    assert sorted(e.tokens[0] for e in pool.host_entries()) == [3, 4]
    assert pool.host_bytes() == 80
    assert pool.counters["host_drops"] == 1


def test_a_follower_whose_leader_finishes_at_its_first_token_copies_the_prefix_it_waited_for() -> None:
    """A follower waits for the leader's prefix "(no prefill of its own)" and copies it once
    computed. A leader that ends in the tick its prefill completes (max_tokens 1, an end of
    generation at once, a cancel) leaves the prefix in its kept lane: the follower copies it from
    there instead of prefilling the whole prompt after having waited for it."""
    sched, engine, _ = make_scheduler(max_batch=2, initial_prefill_tokens_per_s=200.0)  # 64-token steps
    leader, follower = shared_job("leader", max_tokens=1), shared_job("follower")
    sched.add(leader)
    sched.add(follower)
    run_until_idle(sched, engine)
    assert follower.cached_tokens == len(SYSTEM)
    # the system prompt is prefilled once: the leader's own 10, the follower's own 10
    assert prefilled_tokens(engine) == len(SYSTEM) + 2 * 10


def _pinned_entries(sched: Any) -> list[list[int]]:
    return [e.tokens for e in sched.pool.device_entries() if e.pinned]


@pytest.mark.parametrize("max_tokens, eog_after", [(1, {}), (8, {"warm": 1})])
def test_a_pinned_request_that_ends_at_its_first_token_still_pins_its_prompt(max_tokens: int, eog_after: dict[str, int]) -> None:
    """x-superfluid-pin-prefix "caches the request's prompt once prefilled, pinned": also a
    warm-up request with max_tokens 1, or one whose first token ends it (both end in the tick
    their prefill completes). The store runs at the next tick, from the lane the job left,
    before anything else touches it; a later request is seeded from it."""
    sched, engine, _ = make_scheduler(max_batch=1, cache_slots=2, eog_after=eog_after)
    warm = shared_job("warm", max_tokens=max_tokens)
    warm.pin_prefix = True
    sched.add(warm)
    run_until_idle(sched, engine)
    sched.add(make_job(40, job_id="other", max_tokens=2))  # takes the lane: its kept KV goes
    run_until_idle(sched, engine)
    assert _pinned_entries(sched) == [warm.prompt]
    again = shared_job("again", max_tokens=2)
    sched.add(again)
    run_until_idle(sched, engine)
    assert again.cached_tokens == len(SYSTEM)
