"""Review 30: rate limits and concurrency limits as a client sees them (in-process)."""

from __future__ import annotations

from django.test import override_settings

from keys.limits import BucketSet
from keys.runtime import Policy
from scheduler.engines.sim import FakeClock
from tests.keys.test_admission import IP, admit, bearer, expect, fim, key, runtime


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
