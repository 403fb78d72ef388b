"""KV pool accounting and the prefix cache.

The pool is every KV cell the engine holds: ``n_lanes`` lane sequences plus ``cache_slots``
sequences that hold cached prompt prefixes, each ``lane_ctx`` cells, counted in blocks of
``BLOCK_TOKENS``. Live lanes are never evicted. Cached prefixes are: at the high watermark
they are evicted, least recently used first, down to the low watermark; pinned prefixes yield
only when unpinned cache is not enough, oldest first. An evicted prefix leaves the pool for host
memory (unless host moves are suspended under OS memory pressure), where the next request that
shares it imports it back. Every entry belongs to a *scope* (the key policy's cache partition,
"" for keyless requests and policies that share): a prompt only ever matches entries of its
own scope, so one tenant cannot learn from ``cached_tokens`` or TTFT what another one sent.

Invariants:
- a device entry owns exactly one cache slot; ``slot_of`` and ``entries`` agree;
- a host entry owns no slot and holds the engine's artifact;
- ``used_blocks() <= total_blocks``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

BLOCK_TOKENS = 16


def blocks(n_tokens: int) -> int:
    return -(-n_tokens // BLOCK_TOKENS)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(eq=False)
class CachedPrefix:
    key: int
    tokens: list[int]
    pinned: bool
    created_s: float
    last_used_s: float
    slot: int | None = None  # engine sequence id while on the device
    host: Any = None  # engine artifact while in host memory
    host_bytes: int = 0
    hits: int = 0
    pending: bool = False  # its slot is being filled this tick
    held: bool = False  # copied from this tick: its slot is not evicted or refilled before the copy
    scope: str = ""  # the cache partition it belongs to

    @property
    def on_device(self) -> bool:
        return self.slot is not None


@dataclass
class PoolConfig:
    n_lanes: int
    lane_ctx: int
    cache_slots: int = 4
    pressure_high: float = 0.85
    pressure_low: float = 0.70
    min_prefix_tokens: int = 32  # shorter shared prefixes are not worth a copy
    host_cache_bytes: int = 1 << 30


@dataclass
class PoolOps:
    """Cache operations for the engine. ``evict``, ``drop`` and ``store`` run first in a tick
    (before lanes are released or parked: they read live lanes and touch only cache slots);
    ``imports`` then ``copy`` run after lanes are released, before feeds."""

    evict: list[tuple[int, int]] = field(default_factory=list)  # (slot seq, entry key): save to host, clear
    drop: list[int] = field(default_factory=list)  # slot seqs to clear
    store: list[tuple[int, int, int]] = field(default_factory=list)  # (lane seq, slot seq, n tokens)
    imports: list[tuple[int, Any]] = field(default_factory=list)  # (slot seq, artifact)
    copy: list[tuple[int, int, int]] = field(default_factory=list)  # (slot or lane seq, lane seq, n tokens)

    def __bool__(self) -> bool:
        return bool(self.evict or self.drop or self.store or self.imports or self.copy)


class KvPool:
    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.entries: dict[int, CachedPrefix] = {}
        self._keys = itertools.count(1)
        self.host_suspended_until = 0.0
        self.counters = {"prefix_hits": 0, "prefix_tokens_reused": 0, "evictions": 0, "host_imports": 0, "host_drops": 0, "stored": 0}

    # -- accounting --------------------------------------------------------------------

    @property
    def total_blocks(self) -> int:
        return (self.config.n_lanes + self.config.cache_slots) * blocks(self.config.lane_ctx)

    def cache_seq(self, index: int) -> int:
        return self.config.n_lanes + index

    def free_slot(self) -> int | None:
        used = {e.slot for e in self.entries.values() if e.slot is not None}
        for i in range(self.config.cache_slots):
            seq = self.cache_seq(i)
            if seq not in used:
                return seq
        return None

    def device_entries(self) -> list[CachedPrefix]:
        return [e for e in self.entries.values() if e.on_device]

    def host_entries(self) -> list[CachedPrefix]:
        return [e for e in self.entries.values() if not e.on_device]

    def cached_blocks(self) -> int:
        return sum(blocks(len(e.tokens)) for e in self.device_entries())

    def pinned_blocks(self) -> int:
        return sum(blocks(len(e.tokens)) for e in self.device_entries() if e.pinned)

    def used_blocks(self, lane_tokens: list[int]) -> int:
        return sum(blocks(n) for n in lane_tokens) + self.cached_blocks()

    def host_bytes(self) -> int:
        return sum(e.host_bytes for e in self.host_entries())

    # -- lookup ------------------------------------------------------------------------

    def best_match(self, prompt: list[int], scope: str = "") -> tuple[CachedPrefix | None, int]:
        """The entry of ``scope`` sharing the longest prefix with ``prompt`` (device entries
        win ties), and that length, capped so at least one prompt token is left to feed."""
        best: CachedPrefix | None = None
        best_len = 0
        for entry in self.entries.values():
            if entry.pending or entry.scope != scope or (entry.slot is None and entry.host is None):
                continue  # being stored, another scope's, or on its way to host memory this tick
            n = min(common_prefix(entry.tokens, prompt), len(prompt) - 1)
            if n > best_len or (n == best_len and best is not None and entry.on_device and not best.on_device):
                best, best_len = entry, n
        if best_len < self.config.min_prefix_tokens:
            return None, 0
        return best, best_len

    def covered(self, tokens: list[int], scope: str = "") -> bool:
        """True if a cached entry of ``scope`` already holds at least these tokens as its prefix."""
        return any(e.scope == scope and common_prefix(e.tokens, tokens) >= len(tokens) for e in self.entries.values())

    # -- changes -----------------------------------------------------------------------

    def store(
        self, ops: PoolOps, src_seq: int, tokens: list[int], now: float, *, pinned: bool = False, scope: str = ""
    ) -> CachedPrefix | None:
        """Copy ``tokens`` (the first len(tokens) of sequence ``src_seq``) into a cache slot,
        evicting the least valuable device entry if every slot is taken (a pinned one only to
        store a pinned prefix: an ordinary store never displaces a pin). A pinned prefix that a
        device entry already holds pins that entry instead. None when nothing was stored or
        pinned: too short, already covered (unpinned store), or no slot can be freed this tick."""
        if len(tokens) < self.config.min_prefix_tokens:
            return None
        if pinned:
            cover = next((e for e in self.device_entries() if e.scope == scope and common_prefix(e.tokens, tokens) >= len(tokens)), None)
            if cover is not None:
                if not cover.pinned:  # pins yield oldest first: its age as a pin starts now
                    cover.pinned, cover.created_s = True, now
                return cover
        elif self.covered(tokens, scope):
            return None
        slot = self.free_slot()
        if slot is None:
            victim = self._eviction_order(pinned_too=pinned)[:1]
            if not victim:
                return None
            self._evict(ops, victim[0], now)
            slot = self.free_slot()
            assert slot is not None
        entry = CachedPrefix(next(self._keys), list(tokens), pinned, now, now, slot=slot, pending=True, scope=scope)
        self.entries[entry.key] = entry
        ops.store.append((src_seq, slot, len(tokens)))
        self.counters["stored"] += 1
        return entry

    def use(self, ops: PoolOps, entry: CachedPrefix, dst_seq: int, n_tokens: int, now: float) -> bool:
        """Share ``n_tokens`` of a cached prefix into a lane, importing it from host first.
        False (nothing planned) when it is in host memory and every device slot is being filled
        or copied from this tick, or holds a pin and ``entry`` is not pinned."""
        if not entry.on_device:
            slot = self.free_slot()
            if slot is None:
                victims = self._eviction_order(pinned_too=entry.pinned)
                if not victims:
                    return False
                self._evict(ops, victims[0], now)
                slot = self.free_slot()
                assert slot is not None
            ops.imports.append((slot, entry.host))
            entry.slot, entry.host, entry.host_bytes = slot, None, 0
            self.counters["host_imports"] += 1
        assert entry.slot is not None
        ops.copy.append((entry.slot, dst_seq, n_tokens))
        entry.held = True  # the copy runs after this tick's evictions, stores and imports
        entry.last_used_s = now
        entry.hits += 1
        self.counters["prefix_hits"] += 1
        self.counters["prefix_tokens_reused"] += n_tokens
        return True

    def lose(self, seq: int, ops: PoolOps) -> None:
        """The engine could not store a prefix into cache sequence ``seq`` or import one back
        into it (``ops``, the tick's): its entry goes, and that store or import is not counted."""
        for key in [k for k, e in self.entries.items() if e.slot == seq]:
            del self.entries[key]
        self.counters["stored"] -= sum(1 for _, slot, _ in ops.store if slot == seq)
        self.counters["host_imports"] -= sum(1 for slot, _ in ops.imports if slot == seq)

    def settle(self, evicted: dict[int, Any]) -> None:
        """After the engine ran a tick's ops: pending stores are usable; evictions got artifacts."""
        for entry in self.entries.values():
            entry.pending = entry.held = False
        for key, artifact in evicted.items():
            evicted_entry = self.entries.get(key)
            if evicted_entry is not None and evicted_entry.slot is None:
                evicted_entry.host = artifact
                evicted_entry.host_bytes = int(getattr(artifact, "nbytes", 0))
        for key in [k for k, e in self.entries.items() if e.slot is None and e.host is None]:
            del self.entries[key]  # an eviction the engine did not deliver
        self._trim_host()

    def enforce_watermarks(self, ops: PoolOps, lane_tokens: list[int], now: float) -> int:
        """At the high watermark, evict cached prefixes down to the low one. Returns evictions."""
        if self.used_blocks(lane_tokens) < self.share_of_blocks(self.config.pressure_high):
            return 0
        return self.evict_round(ops, lane_tokens, now)

    def evict_round(self, ops: PoolOps, lane_tokens: list[int], now: float, *, at_least_one: bool = False) -> int:
        """Evict down to the low watermark (or one entry if already below and ``at_least_one``)."""
        n = 0
        for entry in self._eviction_order():
            below = self.used_blocks(lane_tokens) <= self.share_of_blocks(self.config.pressure_low)
            if below and not (at_least_one and n == 0):
                break
            self._evict(ops, entry, now)
            n += 1
        return n

    def drop_host(self) -> int:
        dropped = [k for k, e in self.entries.items() if not e.on_device]
        for key in dropped:
            del self.entries[key]
        self.counters["host_drops"] += len(dropped)
        return len(dropped)

    def release_pins(self) -> None:
        for entry in self.entries.values():
            entry.pinned = False

    def clear_device(self, ops: PoolOps) -> None:
        """Drop every device-cached prefix (after the engine refused a plan), and any store
        ``ops`` still plans into their slots."""
        dropped = set()
        for entry in self.device_entries():
            assert entry.slot is not None
            ops.drop.append(entry.slot)
            dropped.add(entry.slot)
            del self.entries[entry.key]
        ops.store = [store for store in ops.store if store[1] not in dropped]

    def share_of_blocks(self, fraction: float) -> float:
        """``fraction`` (a watermark) of the pool's blocks, without the float error of a
        percentage: 70% of 90 blocks is 63, where ``0.7 * 90`` is 62.99..."""
        return round(fraction * self.total_blocks, 6)

    # -- internals ---------------------------------------------------------------------

    def _eviction_order(self, *, pinned_too: bool = True) -> list[CachedPrefix]:
        """Unpinned least recently used first; then (with ``pinned_too``) pinned, oldest first.
        Never one being filled or copied from this tick."""
        device = [e for e in self.device_entries() if not e.pending and not e.held]
        unpinned = sorted((e for e in device if not e.pinned), key=lambda e: e.last_used_s)
        if not pinned_too:
            return unpinned
        pinned = sorted((e for e in device if e.pinned), key=lambda e: e.created_s)
        return unpinned + pinned

    def _evict(self, ops: PoolOps, entry: CachedPrefix, now: float) -> None:
        assert entry.slot is not None
        self.counters["evictions"] += 1
        if now < self.host_suspended_until or self.config.host_cache_bytes <= 0:
            ops.drop.append(entry.slot)
            del self.entries[entry.key]
            return
        ops.evict.append((entry.slot, entry.key))
        entry.slot = None
        entry.pending = True  # not usable until the engine hands over the artifact

    def _trim_host(self) -> None:
        # a prefix bigger than the whole host cache never fits: it goes alone, not with the rest
        for oversized in [e for e in self.host_entries() if e.host_bytes > self.config.host_cache_bytes]:
            del self.entries[oversized.key]
            self.counters["host_drops"] += 1
        hosted = sorted(self.host_entries(), key=lambda e: e.last_used_s)
        while hosted and self.host_bytes() > self.config.host_cache_bytes:
            victim = hosted.pop(0)
            del self.entries[victim.key]
            self.counters["host_drops"] += 1
