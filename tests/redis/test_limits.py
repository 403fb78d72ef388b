"""Limits counted in Redis hold across heads: each RedisLimiter here stands for one head."""

from __future__ import annotations

import pytest

from keys.limits import LimitsUnavailable, RedisLimiter

from .conftest import RedisServer, free_port


async def test_rpm_4_across_two_heads_serves_exactly_4_of_8(redis_server: RedisServer, prefix: str) -> None:
    heads = [RedisLimiter(redis_server.url, prefix) for _ in range(2)]
    results = [await heads[i % 2].take([("key:k", 4 / 60.0, 4)], None, f"m{i}") for i in range(8)]
    assert [r[0] for r in results] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(10 <= wait <= 15 for _refused, wait in results[4:])  # a token every 15 s
    for h in heads:
        await h.aclose()


async def test_a_refused_check_takes_nothing(redis_server: RedisServer, prefix: str) -> None:
    limiter = RedisLimiter(redis_server.url, prefix)
    assert (await limiter.take([("a", 1 / 60.0, 1)], None, "m1"))[0] == 0
    # "b" would pass but "a" is empty: "b" keeps its token
    assert (await limiter.take([("b", 1 / 60.0, 1), ("a", 1 / 60.0, 1)], None, "m2"))[0] == 2
    assert (await limiter.take([("b", 1 / 60.0, 1)], None, "m3"))[0] == 0
    await limiter.aclose()


async def test_concurrency_slots_are_shared_and_released(redis_server: RedisServer, prefix: str) -> None:
    heads = [RedisLimiter(redis_server.url, prefix) for _ in range(2)]
    assert await heads[0].take([], ("k", 2), "one") == (0, 0.0)
    assert await heads[1].take([], ("k", 2), "two") == (0, 0.0)
    assert (await heads[0].take([], ("k", 2), "three"))[0] == 1  # the slot check refused
    await heads[1].release("k", "two")
    assert await heads[0].take([], ("k", 2), "three") == (0, 0.0)
    for h in heads:
        await h.aclose()


async def test_redis_unreachable_is_refused_never_counted_locally() -> None:
    limiter = RedisLimiter(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(LimitsUnavailable):
        await limiter.take([("key:k", 1.0, 4)], None, "m")
    await limiter.aclose()


async def test_a_key_slot_and_a_client_slot_are_taken_together_or_not_at_all(redis_server: RedisServer, prefix: str) -> None:
    from keys.limits import client_slot, key_slot

    heads = [RedisLimiter(redis_server.url, prefix) for _ in range(2)]
    both = [(key_slot("k"), 2), (client_slot("10.0.0.1"), 1)]
    assert await heads[0].take([], both, "one") == (0, 0.0)
    # the client's one place is held (by head 0): head 1 is refused on the second slot, and the
    # key's slot it would have passed is not taken
    assert (await heads[1].take([], both, "two"))[0] == 2
    assert await heads[1].take([], [(key_slot("k"), 2)], "three") == (0, 0.0)
    assert (await heads[1].take([], [(key_slot("k"), 2)], "four"))[0] == 1
    await heads[0].release(client_slot("10.0.0.1"), "one")
    assert (await heads[1].take([], both, "five"))[0] == 1  # the key's 2 are still held
    for h in heads:
        await h.aclose()


async def test_the_same_check_run_again_takes_nothing_twice(redis_server: RedisServer, prefix: str) -> None:
    """redis-py runs a command again when its connection turned out dead after sending it, so a
    limits check whose reply was lost can run twice. The second run used to take a second rate
    token and count the request's own slot as another request: a key allowed one request at a
    time was refused its own."""
    limiter = RedisLimiter(redis_server.url, prefix)
    bucket, slot = [("key:k", 1 / 60.0, 2)], ("k", 1)
    assert await limiter.take(bucket, slot, "one") == (0, 0.0)
    assert await limiter.take(bucket, slot, "one") == (0, 0.0)  # the same call again
    assert await limiter.take(bucket, None, "two") == (0, 0.0)  # the bucket's second token is left
    assert (await limiter.take(bucket, None, "three"))[0] == 1
    assert (await limiter.take([], slot, "four"))[0] == 1  # "one" holds the one place, once
    await limiter.release("k", "one")
    assert await limiter.take([], slot, "four") == (0, 0.0)
    await limiter.aclose()


async def test_a_release_that_overtakes_its_own_check_leaves_nothing_taken(redis_server: RedisServer, prefix: str) -> None:
    """A request cancelled while its limits check waited behind a busy Redis: its release is
    sent on another connection, and Redis may run it before the check. The check then took the
    client's one place for the slot's hour (the client was refused until then); CI saw it once.
    Here the two run in that order."""
    limiter = RedisLimiter(redis_server.url, prefix)
    await limiter.release("k", "late")
    assert await limiter.take([], ("k", 1), "late") == (0, 0.0)  # the cancelled request's check
    assert await limiter.take([], ("k", 1), "next") == (0, 0.0)  # the place is free
    assert (await limiter.take([], ("k", 1), "third"))[0] == 1
    await limiter.aclose()
