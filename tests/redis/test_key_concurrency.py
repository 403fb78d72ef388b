"""A key's ``max_concurrent`` in Redis mode (``--redis``), against a real redis-server (the one
tests/redis/ starts; ``.ci/run`` installs it): each runtime here stands for one head."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from django.test import override_settings

from keys.runtime import KeyRuntime, Policy
from tests.keys.test_admission import IP, admit, bearer, chat, expect, key, runtime, set_policy

from .conftest import RedisServer


@pytest.fixture
async def server() -> AsyncIterator[RedisServer]:
    from keys import limits

    server = RedisServer().start()
    limits._limiters.clear()
    try:
        yield server
    finally:
        for limiter in limits._limiters.values():
            await limiter.aclose()
        limits._limiters.clear()
        server.stop()


def heads(n: int, policy: Policy | None) -> list[KeyRuntime]:
    return [runtime(key("sf-k", "k", policy)) for _ in range(n)]


@pytest.mark.parametrize("before", [None, Policy(name="p", max_concurrent=0)], ids=["no-policy", "no-limit"])
async def test_a_max_concurrent_set_while_requests_run_counts_those_already_running_on_every_head(server: RedisServer, before: Policy | None) -> None:
    with override_settings(SUPERFLUID_REDIS_URL=server.url, SUPERFLUID_MAX_QUEUE=0):
        fleet = heads(2, before)
        running = [await admit(bearer("sf-k"), IP, chat(), runtime=fleet[0]), await admit(bearer("sf-k"), IP, chat(), runtime=fleet[1])]
        for rt in fleet:
            set_policy(rt, "sf-k", "k", Policy(name="p", max_concurrent=2))
        for rt in fleet:
            err = await expect("concurrency_limit_exceeded", admit(bearer("sf-k"), IP, chat(), runtime=rt))
            assert err.status == 429 and int(err.headers["Retry-After"]) >= 1
        await running[0].release()
        third = await admit(bearer("sf-k"), IP, chat(), runtime=fleet[1])  # one ended: one place free
        await expect("concurrency_limit_exceeded", admit(bearer("sf-k"), IP, chat(), runtime=fleet[0]))
        for admission in (running[1], third):
            await admission.release()
        assert all(rt.in_flight.held == {} for rt in fleet)
        again = [await admit(bearer("sf-k"), IP, chat(), runtime=fleet[i]) for i in (0, 1)]  # every place given back
        for admission in again:
            await admission.release()


async def test_with_redis_away_a_key_without_limits_is_served_uncounted_and_a_limited_key_is_503(server: RedisServer) -> None:
    """Counting a key's requests must not make Redis a condition of serving a key that has no
    limits (before, such a request never asked Redis); a key with a limit is still refused."""
    with override_settings(SUPERFLUID_REDIS_URL=server.url, SUPERFLUID_MAX_QUEUE=0):
        free, limited = runtime(key("sf-k", "k")), runtime(key("sf-k", "k", Policy(name="p", max_concurrent=4)))
        server.stop()
        try:
            admission = await admit(bearer("sf-k"), IP, chat(), runtime=free)
            assert admission.shared_slots == [] and free.in_flight.held == {admission.model_slot: 1}
            await admission.release()
            err = await expect("engine_unavailable", admit(bearer("sf-k"), IP, chat(), runtime=limited))
            assert err.status == 503 and limited.in_flight.held == {}
        finally:
            server.start()
