"""Review 30: limits counted in Redis (each RedisLimiter stands for one head)."""

from __future__ import annotations

import asyncio

import pytest
import redis

from keys.limits import RedisLimiter

from .conftest import RedisServer


async def test_the_wait_of_a_refusal_covers_every_bucket_that_refuses(redis_server: RedisServer, prefix: str) -> None:
    """Two buckets empty, one with a token in a minute, the other in an hour: the wait (the
    429's Retry-After) was the first one's, a minute, and the retry then was refused again."""
    limiter = RedisLimiter(redis_server.url, prefix)
    buckets = [("key:k", 1 / 60.0, 1), ("fim:key:k", 1 / 3600.0, 1)]
    assert await limiter.take(buckets, None, "m1") == (0, 0.0)
    refused, wait_s = await limiter.take(buckets, None, "m2")
    assert refused == 1  # the first refused check is still the one named
    assert 3500 <= wait_s <= 3600
    await limiter.aclose()


async def test_a_release_that_fails_while_redis_is_away_is_sent_again(redis_server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request that ended while this head could not reach Redis (a partition, a Redis too busy
    to answer in time; Redis itself kept its data) gave its slot back once, failed, and dropped
    it: the slot stayed taken for SLOT_TTL_S (then an hour), and a key with max_concurrent 1 got 429
    concurrency_limit_exceeded for that hour. The release is sent again until it lands."""
    monkeypatch.setattr(RedisLimiter, "RELEASE_RETRY_S", 0.01, raising=False)
    heads = [RedisLimiter(redis_server.url, prefix) for _ in range(2)]
    assert await heads[0].take([], ("k", 1), "one") == (0, 0.0)
    real_pipeline = heads[0].client.pipeline
    failures = 2

    def away(*args: object, **kwargs: object) -> object:
        nonlocal failures
        if failures:
            failures -= 1
            raise redis.ConnectionError("Redis is away")
        return real_pipeline(*args, **kwargs)

    monkeypatch.setattr(heads[0].client, "pipeline", away)
    await heads[0].release("k", "one")  # Redis away: not given back now
    assert (await heads[1].take([], ("k", 1), "two"))[0] == 1
    # the release is sent again, in the background, until it lands
    releaser = getattr(heads[0], "_releaser", None)
    assert releaser is not None, "nothing sends the release again: the slot is held until it lapses"
    await asyncio.wait_for(releaser, timeout=10)
    assert failures == 0
    assert await heads[1].take([], ("k", 1), "two") == (0, 0.0)
    for h in heads:
        await h.aclose()


async def test_a_bucket_written_before_redis_clock_stepped_back_refills_from_then_on(redis_server: RedisServer, prefix: str) -> None:
    """Buckets are timed by Redis's TIME, a wall clock. After it stepped back (NTP, a VM resumed)
    a bucket's last write lay in the future, and a drained bucket gained nothing until the clock
    caught up with it: here ten minutes of 429s, each saying to retry in a millisecond. A step
    back costs at most the refill time it hid; from then on the bucket refills at its rate."""
    limiter = RedisLimiter(redis_server.url, prefix)
    bucket = [("key:k", 1000.0, 1)]  # a token every millisecond
    now_s, now_us = await limiter.client.time()
    # drained when Redis's clock read ten minutes more than it reads now
    await limiter.client.hset(f"{prefix}rl:key:k", mapping={"tokens": 0, "ts": now_s + now_us / 1e6 + 600})
    refused, wait_s = await limiter.take(bucket, None, "m0")
    assert refused == 1 and wait_s <= 0.002
    loop = asyncio.get_running_loop()
    give_up = loop.time() + 5  # the wait said a millisecond; five seconds is far beyond it
    n = 0
    while (await limiter.take(bucket, None, f"m{n + 1}"))[0] != 0:
        n += 1
        assert loop.time() < give_up, "refused long after the wait it gave (until Redis's clock reaches the bucket's time)"
        await asyncio.sleep(0.01)
    await limiter.aclose()


async def test_a_dead_heads_slot_comes_back_within_a_minute(redis_server: RedisServer, prefix: str) -> None:
    """A head that dies mid-stream never releases its requests' slots. Each lapsed SLOT_TTL_S
    after its last renewal, an hour: a key with max_concurrent 1 whose head died got 429
    concurrency_limit_exceeded on every other head for up to that hour. A place lapses within
    a minute now, and a live head renews its places well within it."""
    dead = RedisLimiter(redis_server.url, prefix)
    assert await dead.take([], ("k", 1), "streaming") == (0, 0.0)
    await dead.aclose()  # gone without a release, as a killed process
    survivor = RedisLimiter(redis_server.url, prefix)
    assert (await survivor.take([], ("k", 1), "next"))[0] == 1  # held while its place lasts
    now_s, now_us = await survivor.client.time()
    lapses_in_s = float(await survivor.client.zscore(f"{prefix}cc:k", "streaming")) - (now_s + now_us / 1e6)
    assert 0 < lapses_in_s <= 60, lapses_in_s
    assert RedisLimiter.RENEW_S <= RedisLimiter.SLOT_TTL_S / 3  # two renewals may fail in a row
    await survivor.aclose()


async def test_a_slot_held_longer_than_its_ttl_by_a_live_request_is_kept(redis_server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot's place lapses SLOT_TTL_S (a minute) after it was taken, so that a dead head's
    places come back. A live request that held one longer (a long stream, a background request
    waiting in a busy queue) lost it as well: a key with max_concurrent 1 got a second request
    in beside it, and another every hour after. A head renews the places its requests hold."""
    monkeypatch.setattr(RedisLimiter, "RENEW_S", 0.01, raising=False)
    heads = [RedisLimiter(redis_server.url, prefix) for _ in range(2)]
    assert await heads[0].take([], ("k", 1), "one") == (0, 0.0)
    key = f"{prefix}cc:k"
    now_s, now_us = await heads[0].client.time()
    now = now_s + now_us / 1e6
    await heads[0].client.zadd(key, {"one": now + 0.5})  # as if its time had nearly run out
    loop = asyncio.get_running_loop()
    give_up = loop.time() + 5
    while (await heads[0].client.zscore(key, "one") or 0) < now + RedisLimiter.SLOT_TTL_S / 2:
        assert loop.time() < give_up, "the place of a request still running is not renewed: it lapses"
        await asyncio.sleep(0.02)
    assert (await heads[1].take([], ("k", 1), "two"))[0] == 1
    await heads[0].release("k", "one")
    await asyncio.sleep(0.05)  # renewals after the release must not bring the place back
    assert await heads[0].client.zscore(key, "one") is None
    assert await heads[1].take([], ("k", 1), "two") == (0, 0.0)
    for h in heads:
        await h.aclose()
