"""Redis mode: the rate token of a request the server refused before its engine saw it goes back
to the fleet's bucket (api/consumers.py refunds it for a 503 ``engine_unavailable``), as it goes
back to a head's own bucket without Redis (tests/keys/test_rate_token_refund_s46.py)."""

from __future__ import annotations

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
        await first.refund()
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
