"""Review 30: rate limits and concurrency limits as a client sees them (in-process)."""

from __future__ import annotations

from django.test import override_settings

from keys.limits import BucketSet
from keys.runtime import Policy
from scheduler.engines.sim import FakeClock
from tests.keys.test_admission import IP, admit, bearer, chat, expect, fim, key, runtime


@override_settings(SUPERFLUID_COMPLETION_RATE="1/h", SUPERFLUID_COMPLETION_BURST=1)
async def test_retry_after_covers_every_limit_that_refuses_not_only_the_first() -> None:
    """A fill-in-the-middle request refused by the key's rpm bucket (a token in 1 s) while its
    fill-in-the-middle bucket is empty too (a token in an hour) was told Retry-After: 1; the
    client retried then and was refused again. Retry-After is the time until every limit passes."""
    clock = FakeClock()
    rt = runtime(key("sf-k", "k", Policy(name="p", rate_limit_rpm=1)))
    rt.buckets, rt.completion_buckets = BucketSet(clock), BucketSet(clock)
    await admit(bearer("sf-k"), IP, fim(), runtime=rt)  # takes a token from both buckets
    clock.advance(59)  # the rpm bucket's next token: in 1 s; the FIM bucket's: in 3541 s
    err = await expect("rate_limit_exceeded", admit(bearer("sf-k"), IP, fim(), runtime=rt))
    retry = int(err.headers["Retry-After"])
    assert retry >= 3541
    clock.advance(retry)  # a client that waits what it was told is served
    await admit(bearer("sf-k"), IP, fim(), runtime=rt)


@override_settings(SUPERFLUID_MAX_BATCH=1, SUPERFLUID_MAX_QUEUE=0, SUPERFLUID_CLIENT_CONCURRENCY=0)
async def test_a_concurrency_429_counts_the_model_the_request_runs_on_in_redis_mode_too(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With several models, a request naming a model by its alias (or a fill-in-the-middle one,
    which runs on the --fim-model) waits behind the requests of the model it runs on. Without
    Redis its 429's Retry-After counted those; in Redis mode it looked the alias up in the
    in-flight counts, found none, and told the client to come back in a second."""
    import scheduler.link.pool as pool_module
    from keys import limits

    class Setup:
        lanes = {"smol": 1}

    class Pool:
        setup = Setup()

        def resolve(self, name: str) -> str | None:
            return {"smol": "smol", "s": "smol"}.get(name)

        def route(self, name: str, *, fim: bool) -> str | None:
            return self.resolve(name)

    class RefusingLimiter:  # Redis's answer: the key's concurrency slot (the one slot) is full
        async def take(self, buckets: list, slots: list, member: str) -> tuple[int, float]:  # type: ignore[type-arg]
            return len(buckets) + 1, 1.0

    monkeypatch.setattr(pool_module, "get_pool", lambda: Pool())
    monkeypatch.setattr(limits, "shared_limiter", lambda url: RefusingLimiter())
    rt = runtime(key("sf-k", "k", Policy(name="p", max_concurrent=1)))
    for _ in range(20):  # 20 in flight on smol; nothing has ended yet (a second each)
        rt.in_flight.acquire("smol")
    rt.slots.acquire("k")  # without Redis: the key's one slot is held here
    local = await expect("concurrency_limit_exceeded", admit(bearer("sf-k"), IP, chat(model="s"), runtime=rt))
    rt.slots.release("k")
    with override_settings(SUPERFLUID_REDIS_URL="redis://127.0.0.1:1/0"):
        shared = await expect("concurrency_limit_exceeded", admit(bearer("sf-k"), IP, chat(model="s"), runtime=rt))
    assert local.headers["Retry-After"] == shared.headers["Retry-After"] == "20"
    assert rt.in_flight.held == {"smol": 20}  # the refused request holds no place

