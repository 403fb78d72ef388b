"""Token buckets and concurrency slots, per process, with an injected clock.

Pure: no Django. A bucket holds up to ``capacity`` tokens and gains ``rate_per_s`` a second; a
request takes one token or is told how long until one is there (``Retry-After``).
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Callable, Hashable

Clock = Callable[[], float]

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$", re.IGNORECASE)
_PER_S = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}


def parse_rate(text: str) -> float:
    """``"10/s"``, ``"600/m"``, ``"100/h"`` -> tokens per second; ``"0"`` or ``"0/s"`` = off (0.0)."""
    if text.strip() in ("0", ""):
        return 0.0
    match = _RATE.match(text)
    if match is None:
        raise ValueError(f"rate {text!r} must look like 10/s, 600/m or 100/h")
    return float(match.group(1)) / _PER_S[match.group(2).lower()]


def retry_after_s(wait_s: float) -> int:
    """Whole seconds for a Retry-After header: rounded up, at least 1."""
    return max(1, math.ceil(wait_s))


class TokenBucket:
    def __init__(self, rate_per_s: float, capacity: float, clock: Clock = time.monotonic) -> None:
        if rate_per_s <= 0 or capacity < 1:
            raise ValueError("a bucket needs a positive rate and a capacity of at least 1")
        self.rate_per_s = rate_per_s
        self.capacity = float(capacity)
        self.clock = clock
        self.tokens = float(capacity)
        self.updated_s = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated_s) * self.rate_per_s)
        self.updated_s = now

    def reconfigure(self, rate_per_s: float, capacity: float) -> None:
        """A policy edit: keep what the bucket holds, within the new capacity."""
        self._refill()
        self.rate_per_s, self.capacity = rate_per_s, float(capacity)
        self.tokens = min(self.tokens, self.capacity)

    def wait_s(self) -> float:
        """Seconds until a token is there; 0.0 if one is there now. Takes nothing."""
        self._refill()
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate_per_s

    def take(self) -> None:
        self._refill()
        self.tokens -= 1.0

    @property
    def full(self) -> bool:
        self._refill()
        return self.tokens >= self.capacity


class BucketSet:
    """One bucket per client key (a key name or an IP), made on first use."""

    MAX_IDLE_BUCKETS = 10_000  # full buckets are dropped past this many: they equal a new one

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self.buckets: dict[Hashable, TokenBucket] = {}

    def bucket(self, client: Hashable, rate_per_s: float, capacity: float) -> TokenBucket:
        b = self.buckets.get(client)
        if b is None:
            if len(self.buckets) >= self.MAX_IDLE_BUCKETS:
                self.buckets = {k: v for k, v in self.buckets.items() if not v.full}
            b = self.buckets[client] = TokenBucket(rate_per_s, capacity, self.clock)
        elif b.rate_per_s != rate_per_s or b.capacity != capacity:
            b.reconfigure(rate_per_s, capacity)
        return b


class ConcurrencySlots:
    """How many requests each client has in flight."""

    def __init__(self) -> None:
        self.held: dict[Hashable, int] = {}

    def available(self, client: Hashable, limit: int) -> bool:
        return limit <= 0 or self.held.get(client, 0) < limit

    def acquire(self, client: Hashable) -> None:
        self.held[client] = self.held.get(client, 0) + 1

    def release(self, client: Hashable) -> None:
        n = self.held.get(client, 0) - 1
        if n > 0:
            self.held[client] = n
        else:
            self.held.pop(client, None)


class DrainMeter:
    """How fast requests leave the server (finish, fail or are cancelled), measured over the
    last ``window_s``: what a ``Retry-After`` for a full queue is computed from."""

    FALLBACK_S_PER_REQUEST = 1.0  # before anything has finished: one second per request ahead
    MAX_RETRY_AFTER_S = 600

    def __init__(self, window_s: float = 30.0, clock: Clock = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self.started_s = clock()
        self.ends: deque[float] = deque()

    def note(self) -> None:
        now = self.clock()
        self.ends.append(now)
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self.ends and self.ends[0] < now - self.window_s:
            self.ends.popleft()

    def rate(self) -> float:
        """Requests leaving per second, recently; 0.0 when none has."""
        now = self.clock()
        self._trim(now)
        span = max(1.0, min(self.window_s, now - self.started_s))
        return len(self.ends) / span

    def retry_after_s(self, ahead: int) -> int:
        """Whole seconds until ``ahead`` more requests have left at the measured rate (1..600)."""
        rate = self.rate()
        wait = ahead / rate if rate > 0 else ahead * self.FALLBACK_S_PER_REQUEST
        return max(1, min(self.MAX_RETRY_AFTER_S, math.ceil(wait)))
