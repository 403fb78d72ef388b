"""Token buckets and concurrency slots with an injected clock."""

from __future__ import annotations

import pytest

from keys.limits import BucketSet, ConcurrencySlots, TokenBucket, parse_rate, retry_after_s
from scheduler.engines.sim import FakeClock


@pytest.mark.parametrize(("text", "per_s"), [("10/s", 10.0), ("600/m", 10.0), ("600/min", 10.0), ("3600/h", 1.0), ("1/m", 1 / 60), ("0", 0.0)])
def test_rates_read_per_second_minute_or_hour(text: str, per_s: float) -> None:
    assert parse_rate(text) == pytest.approx(per_s)


@pytest.mark.parametrize("text", ["10", "ten/s", "10/d", "-1/s", "/s"])
def test_malformed_rates_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(text)


def test_a_full_bucket_allows_its_capacity_then_refills_at_its_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_per_s=2.0, capacity=3, clock=clock)
    for _ in range(3):
        assert bucket.wait_s() == 0.0
        bucket.take()
    assert bucket.wait_s() == pytest.approx(0.5)
    clock.advance(0.25)
    assert bucket.wait_s() == pytest.approx(0.25)
    clock.advance(0.25)
    assert bucket.wait_s() == 0.0
    clock.advance(100)
    for _ in range(3):
        bucket.take()
    assert bucket.wait_s() > 0  # never more than the capacity banked


def test_wait_s_takes_nothing() -> None:
    bucket = TokenBucket(rate_per_s=1.0, capacity=1, clock=FakeClock())
    for _ in range(5):
        assert bucket.wait_s() == 0.0


def test_a_requests_per_minute_bucket_says_when_to_retry() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_per_s=2 / 60, capacity=2, clock=clock)
    bucket.take()
    bucket.take()
    assert retry_after_s(bucket.wait_s()) == 30


def test_retry_after_is_a_whole_second_at_least_one() -> None:
    assert retry_after_s(0.01) == 1
    assert retry_after_s(1.2) == 2
    assert retry_after_s(3.0) == 3


def test_bucket_sets_keep_one_bucket_per_client_and_follow_a_new_capacity() -> None:
    clock = FakeClock()
    buckets = BucketSet(clock)
    a = buckets.bucket("a", 1.0, 5)
    assert buckets.bucket("a", 1.0, 5) is a and buckets.bucket("b", 1.0, 5) is not a
    a.take()
    lowered = buckets.bucket("a", 1.0, 2)
    assert lowered is a and a.capacity == 2 and a.tokens == 2


def test_many_clients_whose_buckets_are_all_in_use_cost_each_new_one_little(monkeypatch: pytest.MonkeyPatch) -> None:
    # every client sent a request within the refill time (one sender with many addresses): no
    # bucket is full, so none can be dropped; each new client used to walk every bucket again
    monkeypatch.setattr(BucketSet, "MAX_IDLE_BUCKETS", 100)
    clock = FakeClock()
    buckets = BucketSet(clock)
    looked_at = 0
    real_full = TokenBucket.full.fget
    assert real_full is not None

    def counted_full(bucket: TokenBucket) -> bool:
        nonlocal looked_at
        looked_at += 1
        return bool(real_full(bucket))

    monkeypatch.setattr(TokenBucket, "full", property(counted_full))
    for n in range(3000):
        buckets.bucket(("ip", n), 1.0, 60).take()
    assert len(buckets.buckets) == 3000  # all in use: all kept
    assert looked_at < 3 * 3000  # a constant share per client (it was ~2,900 per client)
    clock.advance(60)  # all full again: the next sweep drops them
    for n in range(3000, 3000 + 3200):
        buckets.bucket(("ip", n), 1.0, 60)
    assert len(buckets.buckets) < 3200


def test_concurrency_slots_count_per_client() -> None:
    slots = ConcurrencySlots()
    assert slots.available("k", 2)
    slots.acquire("k")
    slots.acquire("k")
    assert not slots.available("k", 2) and slots.available("k", 3) and slots.available("k", 0)
    assert slots.available("other", 1)
    slots.release("k")
    assert slots.available("k", 2)
    slots.release("k")
    slots.release("k")  # an extra release never goes below zero
    assert slots.held == {}
