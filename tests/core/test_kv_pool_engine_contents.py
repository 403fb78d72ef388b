"""KvPool's plans against what an engine's cache slots would hold (a Hypothesis state machine):
the tick's operations run in ``run_tick``'s order (evict, drop, store; import, copy) on a model of
the slots, and after every tick each device entry's slot holds exactly its tokens, each host
entry's artifact holds its tokens, every copy reads the prefix it was planned from, and host
memory stays within ``--host-cache-mb`` (one artifact larger than all of it included)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from scheduler.core.kv_pool import PoolOps

from .builders import KV_PROMPTS, KvPoolMachine


@dataclass
class Artifact:
    tokens: list[int]
    nbytes: int


class PoolOnEngine(KvPoolMachine):
    def __init__(self) -> None:
        super().__init__(cache_slots=2, host_cache_bytes=500)
        self.slots: dict[int, list[int]] = {}
        self.tick_lanes: dict[int, list[int]] = {}  # what each lane holds when this tick's stores run
        self.copies: list[tuple[int, list[int]]] = []  # (dst lane, the tokens it was planned to get)
        self.bytes_per_token = 5

    @rule(tokens=KV_PROMPTS, pinned=st.booleans(), lane=st.integers(0, 1))
    def store(self, tokens: list[int], pinned: bool, lane: int) -> None:
        if self.tick_lanes.setdefault(lane, tokens) != tokens:
            return
        self.pool.store(self.ops, lane, tokens, self.now, pinned=pinned)

    @rule(prompt=KV_PROMPTS, dst=st.integers(0, 1))
    def use(self, prompt: list[int], dst: int) -> None:
        entry, n = self.pool.best_match(prompt + [9])
        if entry is not None and self.pool.use(self.ops, entry, dst, n, self.now):
            self.copies.append((dst, list(entry.tokens[:n])))

    @rule()
    def evict_round(self) -> None:
        self.pool.evict_round(self.ops, [0, 0], self.now, at_least_one=True)

    @rule()
    def pressure(self) -> None:
        self.pool.drop_host()
        self.pool.host_suspended_until = self.now + 2
        self.pool.evict_round(self.ops, [0, 0], self.now, at_least_one=True)

    @rule()
    def release_pins(self) -> None:
        self.pool.release_pins()

    @rule(per_token=st.sampled_from([1, 5, 20]))
    def artifact_size(self, per_token: int) -> None:
        self.bytes_per_token = per_token  # 20 bytes a token: a 32-token prefix is over the host limit

    @rule()
    def run_tick(self) -> None:
        ops, evicted = self.ops, {}
        for slot, key in ops.evict:
            tokens = self.slots.pop(slot)
            evicted[key] = Artifact(tokens, len(tokens) * self.bytes_per_token)
        for slot in ops.drop:
            self.slots.pop(slot, None)
        for lane, slot, n in ops.store:
            assert slot not in self.slots, ops  # a slot is filled only once it is cleared
            self.slots[slot] = list(self.tick_lanes[lane][:n])
        for slot, artifact in ops.imports:
            assert slot not in self.slots, ops
            self.slots[slot] = list(artifact.tokens)
        for (src, dst, n), (planned_dst, planned) in zip(ops.copy, self.copies, strict=True):
            assert dst == planned_dst
            assert self.slots[src][:n] == planned, (ops, src)
        self.pool.settle(evicted)
        self.ops, self.tick_lanes, self.copies = PoolOps(), {}, []
        self.now += 1

    @invariant()
    def contents(self) -> None:
        if self.ops:
            return  # checked between ticks
        p = self.pool
        assert p.host_bytes() <= p.config.host_cache_bytes
        for e in p.entries.values():
            if e.on_device:
                assert self.slots.get(e.slot) == e.tokens
            else:
                assert e.host is not None and e.host.tokens == e.tokens
        assert set(self.slots) == {e.slot for e in p.device_entries()}  # no slot holds a forgotten prefix


TestPoolOnEngine = PoolOnEngine.TestCase
TestPoolOnEngine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
