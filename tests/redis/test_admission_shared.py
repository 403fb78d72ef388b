"""Admission in Redis mode: a keyless client's --client-concurrency is counted in Redis for every
head (each runtime here stands for one head), and a refused request leaves no place held."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from django.test import override_settings

from api.admission import Admission
from tests.keys.test_admission import IP, admit, chat, expect, runtime

from .conftest import RedisServer


async def test_client_concurrency_holds_across_heads_and_a_refusal_holds_nothing(redis_server: RedisServer) -> None:
    from keys import limits

    limits._limiters.clear()
    with override_settings(SUPERFLUID_REDIS_URL=redis_server.url, SUPERFLUID_CLIENT_CONCURRENCY=2, SUPERFLUID_MAX_QUEUE=0):
        heads = [runtime(), runtime()]
        held = [await admit({}, IP, chat(), runtime=heads[0]), await admit({}, IP, chat(), runtime=heads[1])]
        # the third, on either head, is refused: the count is the fleet's, not a head's
        err = await expect("concurrency_limit_exceeded", admit({}, IP, chat(), runtime=heads[0]))
        assert err.status == 429 and int(err.headers["Retry-After"]) >= 1
        assert heads[0].client_slots.held == {} and heads[0].in_flight.held == {held[0].model_slot: 1}
        other = await admit({}, ("10.0.0.8", 1), chat(), runtime=heads[1])  # another address
        await held[0].release()
        held[0] = await admit({}, IP, chat(), runtime=heads[1])
        for admission in [*held, other]:
            await admission.release()
        assert all(h.in_flight.held == {} for h in heads)
    for limiter in limits._limiters.values():
        await limiter.aclose()
    limits._limiters.clear()


async def test_the_first_limits_check_after_a_redis_restart_is_not_refused_for_a_dead_pooled_connection() -> None:
    """After a Redis restart every idle pooled connection of the limiter is dead and failed once
    when drawn: a keyed request right after Redis came back got 503 "cannot be checked" for
    each (the link's own check had the same flaw, found by the fleet test)."""
    import asyncio

    from keys.limits import RedisLimiter

    server = RedisServer().start()
    limiter = RedisLimiter(server.url, prefix="restart:")
    try:
        await asyncio.gather(*(limiter.take([("key:k", 1.0, 60)], None, f"m{i}") for i in range(4)))  # four idle connections
        server.stop()
        server.start()  # the same port, empty
        assert await limiter.take([("key:k", 1.0, 60)], ("key:k", 2), "after") == (0, 0.0)
        assert await limiter.take([("key:k", 1.0, 60)], ("key:k", 2), "again") == (0, 0.0)
    finally:
        await limiter.aclose()
        server.stop()


@pytest.mark.django_db(transaction=True)
async def test_requests_that_end_normally_give_back_every_place_with_shared_limits(redis_server: RedisServer) -> None:
    """Through the ASGI application, which gets its disconnect as soon as the reply is sent (as
    daphne sends it). Giving back a shared slot waits on Redis; that disconnect used to cancel
    the request's task there, so the head's own places (its queue bound) were often never given
    back, and the request was never logged: within a dozen requests, one after another, a
    request was refused as if the queue were full."""
    from keys import limits
    from tests.edge.inproc import JSON, SimWorker, attached, chat_body, request

    limits._limiters.clear()
    with override_settings(SUPERFLUID_REDIS_URL=redis_server.url, SUPERFLUID_CLIENT_CONCURRENCY=1, SUPERFLUID_MAX_QUEUE=1):
        async with attached(SimWorker()) as (_link, rt):
            for i in range(12):
                stream = i % 2 == 1
                reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=3, stream=stream), JSON)
                assert reply.status == 200, (i, reply.body)
            assert rt.in_flight.held == {} and rt.client_slots.held == {}
    for limiter in limits._limiters.values():
        await limiter.aclose()
    limits._limiters.clear()


async def test_a_request_cancelled_while_redis_checks_its_limits_holds_nothing(redis_server: RedisServer) -> None:
    """The client goes away while the limits script is on its way (here Redis is busy with
    a spinning script): the head's queue place and the Redis slot the script took are given back. Both used
    to be held: the head's for good (the queue filled up), Redis's for the slot's hour."""
    import asyncio

    from keys import limits

    from .conftest import Busy, commands_run, under_spin, until_sent

    async with a_head_of_one_place_a_client(redis_server) as (admin, head):
        [limiter] = limits._limiters.values()
        checks = commands_run(admin, "evalsha")
        tries = 0

        async def cancel_while_checked(busy: Busy) -> bool:
            nonlocal tries
            tries += 1
            task = asyncio.get_running_loop().create_task(admit({}, IP, chat(), runtime=head))
            await until_sent(limiter.client)  # the limits check waits behind the script
            late = busy.over()
            task.cancel()
            [ended] = await asyncio.gather(task, return_exceptions=True)
            if late:  # Redis may have answered first: try again
                if isinstance(ended, Admission):
                    await ended.release()
                return False
            assert isinstance(ended, asyncio.CancelledError), ended  # cancelled before Redis answered
            return True

        spinning = await under_spin(redis_server.port, cancel_while_checked)
        assert head.in_flight.held == {}
        await asyncio.to_thread(spinning.join)
        assert await asyncio.to_thread(commands_run, admin, "evalsha") == checks + tries  # the check reached Redis


@contextlib.asynccontextmanager
async def a_head_of_one_place_a_client(redis_server: RedisServer) -> AsyncIterator[tuple[Any, Any]]:
    """(an admin Redis client, a head) whose keyless clients have one place each, counted in
    Redis, with the limiter's connection open; at the end no Redis slot may be held and the
    client's place must be free."""
    import redis

    from keys import limits

    limits._limiters.clear()
    admin = redis.Redis(port=redis_server.port)
    with override_settings(SUPERFLUID_REDIS_URL=redis_server.url, SUPERFLUID_CLIENT_CONCURRENCY=1, SUPERFLUID_MAX_QUEUE=0):
        head = runtime()
        warm = await admit({}, IP, chat(), runtime=head)
        await warm.release()
        yield admin, head
        await no_slot_held(admin, head)
    admin.close()
    await close_limiters()


async def no_slot_held(admin: Any, head: Any) -> None:
    """No Redis concurrency slot is held (each is given back by a task of its own) and the
    client's one place is free: its next request is admitted."""
    import asyncio

    for _ in range(100):
        if not any(admin.zcard(k) for k in admin.scan_iter("sf:cc:*")):
            break
        await asyncio.sleep(0.02)
    assert [(k, admin.zcard(k)) for k in admin.scan_iter("sf:cc:*") if admin.zcard(k)] == []
    again = await admit({}, IP, chat(), runtime=head)
    await again.release()


async def close_limiters() -> None:
    from keys import limits

    for limiter in limits._limiters.values():
        await limiter.aclose()
    limits._limiters.clear()
