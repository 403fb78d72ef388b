"""KvPool accounting under any sequence of stores, uses, host imports, eviction rounds,
watermarks, OS pressure, pin releases, failed stores and settles (a Hypothesis state machine):
blocks used never negative nor over the total, one entry per cache slot, one fill per slot per
tick, a pin never displaced by an ordinary store or import, a match only inside its own scope,
host memory within its budget after each tick, counters never negative."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from scheduler.core.kv_pool import PoolOps, blocks

from .builders import KV_PROMPTS, KvPoolMachine


class Pool(KvPoolMachine):
    def __init__(self) -> None:
        super().__init__(cache_slots=3, host_cache_bytes=300)
        self.lanes = [0, 0]

    @rule(tokens=KV_PROMPTS, pinned=st.booleans(), scope=st.sampled_from(["", "a"]), lane=st.integers(0, 1))
    def store(self, tokens: list[int], pinned: bool, scope: str, lane: int) -> None:
        self.lanes[lane] = len(tokens)
        pins = {e.key for e in self.pool.device_entries() if e.pinned}
        self.pool.store(self.ops, lane, tokens, self.now, pinned=pinned, scope=scope)
        if not pinned:  # an ordinary store never displaces a pin
            assert pins <= {e.key for e in self.pool.device_entries() if e.pinned}

    @rule(prompt=KV_PROMPTS, scope=st.sampled_from(["", "a"]))
    def use(self, prompt: list[int], scope: str) -> None:
        entry, n = self.pool.best_match(prompt + [9], scope)
        if entry is not None:
            assert entry.scope == scope
            pins = {e.key for e in self.pool.device_entries() if e.pinned}
            if self.pool.use(self.ops, entry, 0, n, self.now) and not entry.pinned:  # nor does an import
                assert pins <= {e.key for e in self.pool.device_entries() if e.pinned}

    @rule(i=st.integers(0, 5))
    def import_from_host(self, i: int) -> None:
        hosted = [e for e in self.pool.host_entries() if e.host is not None]
        if hosted:
            entry = hosted[i % len(hosted)]
            pins = {e.key for e in self.pool.device_entries() if e.pinned}
            if self.pool.use(self.ops, entry, 1, 32, self.now):
                assert entry.on_device
                if not entry.pinned:
                    assert pins <= {e.key for e in self.pool.device_entries() if e.pinned}

    @rule()
    def evict_round(self) -> None:
        self.pool.evict_round(self.ops, self.lanes, self.now, at_least_one=True)

    @rule()
    def watermarks(self) -> None:
        self.pool.enforce_watermarks(self.ops, self.lanes, self.now)

    @rule()
    def pressure(self) -> None:
        self.pool.drop_host()
        self.pool.host_suspended_until = self.now + 3
        self.pool.evict_round(self.ops, self.lanes, self.now, at_least_one=True)

    @rule()
    def release_pins(self) -> None:
        self.pool.release_pins()

    @rule(lose=st.booleans(), deliver=st.booleans(), size=st.integers(0, 400))
    def settle(self, lose: bool, deliver: bool, size: int) -> None:
        if lose and self.ops.store:
            self.pool.lose(self.ops.store[0][1], self.ops)
        evicted = {key: SimpleNamespace(nbytes=size) for _, key in self.ops.evict} if deliver else {}
        self.pool.settle(evicted)
        self.ops = PoolOps()
        self.now += 1

    @rule(dt=st.floats(0, 100))
    def tick(self, dt: float) -> None:
        self.now += dt

    @invariant()
    def accounting(self) -> None:
        p = self.pool
        slots = [e.slot for e in p.entries.values() if e.slot is not None]
        assert len(slots) == len(set(slots))
        assert all(p.config.n_lanes <= s < p.config.n_lanes + p.config.cache_slots for s in slots)
        assert 0 <= p.used_blocks(self.lanes) <= p.total_blocks
        assert p.cached_blocks() <= p.config.cache_slots * blocks(p.config.lane_ctx)
        assert all(v >= 0 for v in p.counters.values()), p.counters
        for e in p.entries.values():
            assert e.slot is None or e.host is None
        fills = [slot for _, slot, _ in self.ops.store] + [slot for slot, _ in self.ops.imports]
        assert len(fills) == len(set(fills)), self.ops  # one fill per cache slot per tick
        assert {src for src, _, _ in self.ops.copy if src >= p.config.n_lanes} <= set(slots)  # copies read live entries
        if not self.ops:
            assert p.host_bytes() <= p.config.host_cache_bytes
            assert all(e.on_device or e.host is not None for e in p.entries.values())


TestPool = Pool.TestCase
TestPool.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
