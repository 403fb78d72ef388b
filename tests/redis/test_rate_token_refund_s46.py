"""Redis mode: the rate token of a request the server refused before its engine saw it goes back
to the fleet's bucket (api/consumers.py refunds it for a 503 ``engine_unavailable``), as it goes
back to a head's own bucket without Redis (tests/keys/test_rate_token_refund_s46.py)."""

from __future__ import annotations

import asyncio

import pytest
from django.test import override_settings

from api.admission import admit
from keys.limits import RedisLimiter
from keys.runtime import Policy
from scheduler.core.qos import QosClass
from tests.keys.test_admission import IP, bearer, chat, expect, key, runtime

from .conftest import RedisServer


async def test_a_refunded_token_is_there_for_the_next_request(redis_server: RedisServer, prefix: str) -> None:
    limiter = RedisLimiter(redis_server.url, prefix)
    assert (await limiter.take([("key:k", 1 / 60.0, 1)], None, "m1"))[0] == 0
    assert (await limiter.take([("key:k", 1 / 60.0, 1)], None, "m2"))[0] == 1
    await limiter.refund([("key:k", 1 / 60.0, 1)])
    assert (await limiter.take([("key:k", 1 / 60.0, 1)], None, "m3"))[0] == 0
    await limiter.refund([("key:k", 1 / 60.0, 1)])
    await limiter.refund([("key:k", 1 / 60.0, 1)])  # never beyond the capacity
    assert (await limiter.take([("key:k", 1 / 60.0, 1)], None, "m4"))[0] == 0
    assert (await limiter.take([("key:k", 1 / 60.0, 1)], None, "m5"))[0] == 1
    await limiter.aclose()


async def test_an_admission_refunded_gives_the_keys_token_back_across_heads(redis_server: RedisServer) -> None:
    from keys import limits

    limits._limiters.clear()
    secret, k = key("sk-refund-redis-0123456789", "refund-redis", Policy(name="p", max_class=QosClass.INTERACTIVE, rate_limit_rpm=1))
    with override_settings(SUPERFLUID_REDIS_URL=redis_server.url, SUPERFLUID_MAX_QUEUE=0):
        heads = [runtime((secret, k)), runtime((secret, k))]
        first = await admit(bearer(secret), IP, chat(), runtime=heads[0])
        await expect("rate_limit_exceeded", admit(bearer(secret), IP, chat(), runtime=heads[1]))
        refunding = first.refund()
        assert refunding is not None
        await refunding
        await first.release()
        second = await admit(bearer(secret), IP, chat(), runtime=heads[1])
        await second.release()
        await expect("rate_limit_exceeded", admit(bearer(secret), IP, chat(), runtime=heads[0]))
    for limiter in limits._limiters.values():
        await limiter.aclose()
    limits._limiters.clear()


async def test_the_tokenizer_routes_limits_are_the_fleets_in_redis_mode(redis_server: RedisServer) -> None:
    """/tokenize and /detokenize (api.admission.admit_tool) take the key's rate token and
    concurrency place in Redis, across heads, with no model queue bound."""
    from api.admission import admit_tool, authenticate
    from keys import limits

    limits._limiters.clear()
    policy = Policy(name="tok", max_class=QosClass.INTERACTIVE, rate_limit_rpm=2, max_concurrent=1)
    secret, k = key("sk-tokenizer-redis-0123456789", "tokenizer-redis", policy)
    with override_settings(SUPERFLUID_REDIS_URL=redis_server.url):
        heads = [runtime((secret, k)), runtime((secret, k))]
        who = await authenticate(bearer(secret), IP, heads[0])
        first = await admit_tool(who, heads[0])
        assert first.model_slot is None and heads[0].in_flight.held == {}
        await expect("concurrency_limit_exceeded", admit_tool(who, heads[1]))
        await first.release()
        second = await admit_tool(who, heads[1])
        await second.release()
        await expect("rate_limit_exceeded", admit_tool(who, heads[0]))
    for limiter in limits._limiters.values():
        await limiter.aclose()
    limits._limiters.clear()


@pytest.mark.django_db(transaction=True)
async def test_through_the_application_a_refused_request_gives_its_token_back_in_redis(redis_server: RedisServer) -> None:
    """A keyless client under --rate-limit 1 whose first request the worker refused (no engine)
    is served next, with shared limits; the one after that is 429. Nothing stays held."""
    from keys import limits
    from scheduler.link import messages as m
    from tests.edge.inproc import JSON, SimWorker, attached, chat_body, request
    from tests.keys.test_release_admission_paths import scripted

    limits._limiters.clear()
    with override_settings(SUPERFLUID_REDIS_URL=redis_server.url, SUPERFLUID_RATE_LIMIT=1, SUPERFLUID_CLIENT_CONCURRENCY=1):
        async with attached(SimWorker()) as (link, rt):
            real = link.submit
            scripted(link, [[lambda job_id: m.Rejected(job_id, m.ENGINE_UNAVAILABLE, "gone")]])
            refused = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON)
            link.submit = real
            await asyncio.gather(*limits_refunds())
            served = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON)
            limited = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON)
            assert rt.in_flight.held == {} and rt.client_slots.held == {}
    for limiter in limits._limiters.values():
        await limiter.aclose()
    limits._limiters.clear()
    assert (refused.status, served.status, limited.status) == (503, 200, 429), (refused.body, served.body, limited.body)


def limits_refunds() -> list[asyncio.Task[None]]:
    from api.admission import _refunding

    return list(_refunding)
