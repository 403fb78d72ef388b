"""Token buckets and concurrency slots, per process, with an injected clock; and the same limits
counted in Redis for a fleet of heads (:class:`RedisLimiter`, Redis mode).

Pure: no Django. A bucket holds up to ``capacity`` tokens and gains ``rate_per_s`` a second; a
request takes one token or is told how long until one is there (``Retry-After``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections import deque
from collections.abc import Callable, Hashable

from scheduler.aio import keeping_cancel

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

    def give_back(self) -> None:
        """The token a request took, returned (the server refused it before its engine saw it);
        never beyond the capacity."""
        self._refill()
        self.tokens = min(self.capacity, self.tokens + 1.0)

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
        # the size at which the next sweep runs: twice what the last one kept, so that many
        # clients whose buckets are all in use (addresses one sender owns) cost each new client
        # a constant share of the sweeps, not a walk over every bucket
        self.sweep_at = self.MAX_IDLE_BUCKETS

    def bucket(self, client: Hashable, rate_per_s: float, capacity: float) -> TokenBucket:
        b = self.buckets.get(client)
        if b is None:
            if len(self.buckets) >= self.sweep_at:
                self.buckets = {k: v for k, v in self.buckets.items() if not v.full}
                self.sweep_at = max(self.MAX_IDLE_BUCKETS, 2 * len(self.buckets))
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


# -- limits that hold across processes (Redis mode) -------------------------------------------

# Every check, then every take, in one script on the server's clock, so two heads can neither
# both take the last token nor see different times. A bucket is a hash {tokens, ts}; a
# concurrency slot (an API key's, a keyless client's) is a sorted set of the admissions holding
# it, scored by when the place lapses (a head that dies without releasing frees them after
# SLOT_TTL_S). A call that took marks its member for a minute, so the same call run again (the
# client retried a call whose reply was lost) takes nothing twice.
# ARGV: prefix, n_buckets, (name, rate_per_s, capacity) x n_buckets, n_slots,
#       (slot_name, slot_limit) x n_slots, member, slot_ttl_s.   Returns {0, 0} when taken, else
#       {refused check (1-based; n_buckets + j = the j-th slot), milliseconds until it would pass}.
LIMITS_LUA = """
local p, n = ARGV[1], tonumber(ARGV[2])
local base = 3 * n + 3
local m = tonumber(ARGV[base])
local member, ttl = ARGV[base + 2 * m + 1], tonumber(ARGV[base + 2 * m + 2])
-- the same call run again (its reply was lost and the client retried): it has taken already
if redis.call("EXISTS", p .. "lm:" .. member) == 1 then
  return {0, 0}
end
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local state = {}
-- the first bucket that refuses is named; the wait is the longest of all that refuse (the
-- request passes only once every one has a token)
local refused, wait = 0, 0
for i = 1, n do
  local key = p .. "rl:" .. ARGV[3 * i]
  local rate, cap = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local cur = redis.call("HMGET", key, "tokens", "ts")
  local tokens = tonumber(cur[1]) or cap
  local ts = tonumber(cur[2]) or now
  if ts > now then
    -- Redis's clock (TIME, a wall clock) stepped back since the last write: count from now,
    -- or the bucket gained nothing until the clock caught up (429s for the whole step)
    redis.call("HSET", key, "ts", now)
    ts = now
  end
  tokens = math.min(cap, tokens + (now - ts) * rate)
  if tokens < 1 then
    if refused == 0 then refused = i end
    wait = math.max(wait, math.ceil((1 - tokens) / rate * 1000))
  end
  state[i] = {key, tokens, rate, cap}
end
if refused > 0 then
  return {refused, wait}
end
for j = 1, m do
  local skey, limit = p .. "cc:" .. ARGV[base + 2 * j - 1], tonumber(ARGV[base + 2 * j])
  redis.call("ZREMRANGEBYSCORE", skey, "-inf", now)
  if redis.call("ZCARD", skey) >= limit then
    return {n + j, 1000}
  end
end
for i = 1, n do
  local s = state[i]
  redis.call("HSET", s[1], "tokens", s[2] - 1, "ts", now)
  redis.call("EXPIRE", s[1], math.ceil(s[4] / s[3]) + 1)
end
for j = 1, m do
  local skey = p .. "cc:" .. ARGV[base + 2 * j - 1]
  redis.call("ZADD", skey, now + ttl, member)
  redis.call("EXPIRE", skey, ttl + 1)
end
redis.call("SET", p .. "lm:" .. member, "1", "EX", 60)
return {0, 0}
"""


# A head's renewal of the places its running requests hold, so that a request that runs (or
# waits) longer than SLOT_TTL_S keeps its place; only a dead head's places lapse. XX: a place
# given back meanwhile is not brought back. ARGV: prefix, slot_ttl_s, (slot_name, member) x n.
RENEW_LUA = """
local p, ttl = ARGV[1], tonumber(ARGV[2])
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
for i = 3, #ARGV, 2 do
  local skey = p .. "cc:" .. ARGV[i]
  redis.call("ZADD", skey, "XX", now + ttl, ARGV[i + 1])
  redis.call("EXPIRE", skey, ttl + 1)
end
return 0
"""


# Another head takes over the places a request holds (its client resumed its stream there,
# Last-Event-ID): the first head's member leaves each slot and the new one holds it from now,
# whether or not the first one's had lapsed (the request runs: it counts, once). The old member's
# marker is set, so that the first head, if it lives, renews nothing and releases nothing of it.
# ARGV: prefix, ttl, old member, new member, slot x n.
TAKEOVER_LUA = """
local p, ttl, old, new = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
for i = 5, #ARGV do
  local skey = p .. "cc:" .. ARGV[i]
  redis.call("ZREM", skey, old)
  redis.call("ZADD", skey, now + ttl, new)
  redis.call("EXPIRE", skey, ttl + 1)
end
redis.call("SET", p .. "lm:" .. old, "1", "EX", 60)
return 0
"""


# A token given back (a request the server refused before its engine saw it): added to the bucket
# as it stands now, within its capacity; a bucket that is gone (expired: full again) is left so.
# ARGV: prefix, (name, rate_per_s, capacity) x n.
REFUND_LUA = """
local p = ARGV[1]
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
for i = 2, #ARGV, 3 do
  local key = p .. "rl:" .. ARGV[i]
  local rate, cap = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local cur = redis.call("HMGET", key, "tokens", "ts")
  if cur[1] then
    local ts = math.min(tonumber(cur[2]) or now, now)
    local tokens = math.min(cap, tonumber(cur[1]) + (now - ts) * rate + 1)
    redis.call("HSET", key, "tokens", tokens, "ts", now)
  end
end
return 0
"""


def key_slot(key_name: str) -> str:
    """The Redis concurrency slot of an API key (by name)."""
    return key_name


def client_slot(client_id: str) -> str:
    """The Redis concurrency slot of a keyless client (by address), apart from any key's."""
    return f"\x00client:{client_id}"


class LimitsUnavailable(Exception):
    """The shared limits cannot be checked (Redis unreachable): refuse, never count locally."""


class RedisLimiter:
    """Per-key rate buckets and concurrency slots counted in Redis, for every head at once."""

    # A slot a dead head never released lapses after this long: a minute, so that a key at its
    # max_concurrent whose head died mid-stream is refused for that minute at most (an hour
    # before). A live head renews its requests' places four times as often, so a renewal may be
    # lost (Redis away for a moment, a stalled loop) with the place kept.
    SLOT_TTL_S = 60
    RELEASE_RETRY_S = 0.5  # a failed release is sent again after this, then twice as long each time
    RELEASE_RETRY_MAX_S = 30.0
    MAX_UNRELEASED = 100_000  # failed releases kept to send again (Redis away long, many requests)
    RELEASE_BATCH = 500  # failed releases sent again per transaction
    RENEW_S = SLOT_TTL_S / 4  # the places this head's requests hold are renewed this often

    def __init__(self, url: str, prefix: str = "sf:") -> None:
        from scheduler.link.redis_transport import reconnecting_client

        self.prefix = prefix
        # a dead pooled connection is retried, not a 503; a check whose reply was lost and that
        # runs again takes nothing twice (the script marks what its member took)
        self.client = reconnecting_client(url)
        self.script = self.client.register_script(LIMITS_LUA)
        # releases that failed (place -> when it lapses by itself), sent again by one task
        self._unreleased: dict[tuple[str, str], float] = {}
        self._releaser: asyncio.Task[None] | None = None
        self.renew_script = self.client.register_script(RENEW_LUA)
        self.refund_script = self.client.register_script(REFUND_LUA)
        self.takeover_script = self.client.register_script(TAKEOVER_LUA)
        self.held: dict[str, set[str]] = {}  # member -> the slots it holds (this head's requests)
        self._renewer: asyncio.Task[None] | None = None

    async def take(
        self, buckets: list[tuple[str, float, float]], slots: tuple[str, int] | list[tuple[str, int]] | None, member: str
    ) -> tuple[int, float]:
        """Check every bucket (name, rate per second, capacity) and every slot (name, limit; one
        or a list), then take them all: ``(0, 0.0)``; or ``(i, wait_s)`` for the first refused
        check (1-based; ``len(buckets) + j`` is the j-th slot), taking nothing; ``wait_s`` is the
        longest wait of every bucket that refuses.
        LimitsUnavailable if Redis is away."""
        if slots is None:
            slots = []
        elif isinstance(slots, tuple):
            slots = [slots]
        slots = [(name, limit) for name, limit in slots if limit > 0]
        args: list[object] = [self.prefix, len(buckets)]
        for name, rate, capacity in buckets:
            args += [name, rate, capacity]
        args.append(len(slots))
        for name, limit in slots:
            args += [name, limit]
        args += [member, self.SLOT_TTL_S]
        try:
            refused, wait_ms = await keeping_cancel(self.script(keys=[], args=[str(a) for a in args]))
        except Exception as exc:  # redis.RedisError, OSError, a timeout
            raise LimitsUnavailable(str(exc)) from exc
        if not int(refused) and slots:
            self.held[member] = {name for name, _limit in slots}
            if self._renewer is None or self._renewer.done():
                self._renewer = asyncio.get_running_loop().create_task(self._renew_held())
        return int(refused), int(wait_ms) / 1000.0

    async def take_over(self, slots: list[str], old_member: str, member: str) -> None:
        """Hold ``slots`` under ``member`` in place of ``old_member`` (a request another head
        admitted, whose stream this head resumed): counted once, renewed by this head from now,
        and given back by ``release(slot, member)``. LimitsUnavailable if Redis is away."""
        if not slots:
            return
        args = [self.prefix, str(self.SLOT_TTL_S), old_member, member, *slots]
        try:
            await keeping_cancel(self.takeover_script(keys=[], args=args))
        except Exception as exc:  # redis.RedisError, OSError, a timeout
            raise LimitsUnavailable(str(exc)) from exc
        self.held[member] = set(slots)
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_held())

    async def refund(self, buckets: list[tuple[str, float, float]]) -> None:
        """Give back one token to each bucket (name, rate per second, capacity) that ``take``
        took it from. Best effort: Redis away, the token stays spent."""
        if not buckets:
            return
        args: list[object] = [self.prefix]
        for name, rate, capacity in buckets:
            args += [name, rate, capacity]
        with contextlib.suppress(Exception):  # redis.RedisError, OSError, a timeout
            await self.refund_script(keys=[], args=[str(a) for a in args])

    async def aclose(self) -> None:
        """Stop renewing and resending (what is left lapses by itself) and close the client."""
        for task in (self._renewer, self._releaser):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.client.aclose()

    async def _renew_held(self) -> None:
        """While this head's requests hold places, renew them every RENEW_S."""
        while self.held:
            await asyncio.sleep(self.RENEW_S)
            args: list[str] = [self.prefix, str(self.SLOT_TTL_S)]
            for member, slots in list(self.held.items()):
                for slot in slots:
                    args += [slot, member]
            if len(args) > 2:
                with contextlib.suppress(Exception):  # Redis away: renewed at the next turn
                    await self.renew_script(keys=[], args=args)

    async def release(self, slot: str, member: str) -> None:
        """Give ``member``'s place in ``slot`` back. The member's marker is set with it, so that a
        check of the same member still on its way to Redis (its request was cancelled while the
        check waited there, and this release went out on another connection and overtook it)
        finds it set and takes nothing: otherwise that late check took the place until it
        lapsed. A release that fails (Redis unreachable or too slow to answer, while it keeps its
        data) is sent again, with every other that failed, until it lands: dropped, it held the
        place until it lapsed, and a key at its ``max_concurrent`` got 429 all that time."""
        held = self.held.get(member)
        if held is not None:
            held.discard(slot)
            if not held:
                del self.held[member]
        if await self._release_once([(slot, member)]):
            return
        if len(self._unreleased) < self.MAX_UNRELEASED:  # beyond: they lapse by themselves
            loop = asyncio.get_running_loop()
            self._unreleased.setdefault((slot, member), loop.time() + self.SLOT_TTL_S)
        if self._releaser is None or self._releaser.done():
            self._releaser = asyncio.get_running_loop().create_task(self._release_later())

    async def _release_once(self, places: list[tuple[str, str]]) -> bool:
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                for slot, member in places:
                    pipe.set(f"{self.prefix}lm:{member}", "1", ex=60)
                    pipe.zrem(f"{self.prefix}cc:{slot}", member)
                await pipe.execute()
        except Exception:  # redis.RedisError, OSError, a timeout
            return False
        return True

    async def _release_later(self) -> None:
        """Send the releases that failed again, all at once, backing off while Redis stays away;
        a place whose time has run out has lapsed by itself and is dropped."""
        loop = asyncio.get_running_loop()
        delay = self.RELEASE_RETRY_S
        while self._unreleased:
            await asyncio.sleep(delay)
            now = loop.time()
            for place in [p for p, lapsed_at in self._unreleased.items() if lapsed_at <= now]:
                del self._unreleased[place]
            places = list(self._unreleased)[: self.RELEASE_BATCH]
            if not places:
                return
            if await self._release_once(places):
                for place in places:
                    self._unreleased.pop(place, None)
                delay = 0.0  # Redis answers: the next batch at once
            else:
                delay = min(self.RELEASE_RETRY_MAX_S, max(self.RELEASE_RETRY_S, 2 * delay))


_limiters: dict[tuple[int, str], RedisLimiter] = {}


def shared_limiter(url: str) -> RedisLimiter:
    """The running event loop's limiter for ``url`` (an asyncio Redis client serves one loop)."""
    key = (id(asyncio.get_running_loop()), url)
    limiter = _limiters.get(key)
    if limiter is None:
        limiter = _limiters[key] = RedisLimiter(url)
    return limiter
