"""The harness of the engines' differential KV tests (test_kv_differential.py on llama.cpp,
test_mlx_differential.py on MLX): the real scheduler on a fake clock plans ticks for a family of
prompts that share prefixes in every way the caches meet them, the engine runs them, and every
request must get what it gets alone in an empty lane."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from scheduler.core.qos import QosClass
from scheduler.core.scheduler import Scheduler, SchedulerConfig
from scheduler.core.types import Job, SamplingParams
from scheduler.engines.base import Step, run_tick
from scheduler.engines.sim import FakeClock
from testkit.engine_driver import chat, generate, release

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, top_k=40, seed=11, ignore_eos=True)


def make_family(engine: Any) -> list[list[int]]:
    """Prompts that share prefixes in every way the caches meet them."""
    base = chat(engine, "Tell me a short story about a brave little mouse who lives in a castle.")
    other = chat(engine, "List three colours of the rainbow and say why the sky is blue.")
    more = engine.tokenize(" Please keep it short.", add_special=False)
    return [
        base,  # 0
        base[:-1] + [engine.tokenize(" cat", add_special=False)[0]],  # 1: all but the last token
        base + more[:1],  # 2: one token longer
        base + more,  # 3: an extension
        base[: len(base) // 2] + other[len(other) // 2 :],  # 4: the first half shared
        other,  # 5: only the chat template's opening shared
    ]


class References:
    """Each prompt's reply (greedy, or seeded) generated alone in an empty lane 0, made once:
    ``refs(prompt, n, seeded)``; ``empty`` empties every lane and cache slot first."""

    def __init__(self, engine: Any, empty: Callable[[Any], None], max_tokens: int) -> None:
        self.engine, self.empty, self.max_tokens = engine, empty, max_tokens
        self.made: dict[tuple[bool, tuple[int, ...]], list[int]] = {}

    def __call__(self, prompt: list[int], n: int, seeded: bool = False) -> list[int]:
        key = (seeded, tuple(prompt))
        if key not in self.made:
            self.empty(self.engine)
            self.made[key] = generate(self.engine, 0, prompt, SEEDED if seeded else GREEDY, max_tokens=self.max_tokens)
            release(self.engine, 0)
        return self.made[key][:n]


_references: dict[int, References] = {}


def references(engine: Any, empty: Callable[[Any], None], max_tokens: int) -> References:
    """The engine's :class:`References` (one per engine, its replies kept across tests)."""
    refs = _references.get(id(engine))
    if refs is None or refs.engine is not engine:
        refs = _references[id(engine)] = References(engine, empty, max_tokens)
    return refs


@dataclass
class Arrival:
    tick: int
    prompt: int  # index into the family
    max_tokens: int
    qos: QosClass
    pin: bool
    seeded: bool = False


def arrivals(max_tokens: int) -> st.SearchStrategy[Arrival]:
    return st.builds(
        Arrival,
        tick=st.integers(0, 12),
        prompt=st.integers(0, 5),
        max_tokens=st.integers(1, max_tokens),
        qos=st.sampled_from([QosClass.INTERACTIVE, QosClass.AGENT, QosClass.BACKGROUND]),
        pin=st.booleans(),
        seeded=st.booleans(),
    )


def config_of(
    lanes: int, budget: int, rate: float, park: bool, compact: bool, slots: int, *, lane_ctx: int, watermarks: tuple[float, float] | None = None
) -> SchedulerConfig:
    """A scheduler for the drawn shapes; ``watermarks`` (high, low) turns the occupancy
    watermarks on. Lane moves wherever asked (an engine that serve runs without them, MLX, still
    has every primitive a move uses: a move must still be exact)."""
    return SchedulerConfig(
        max_batch=lanes,
        lane_ctx=lane_ctx,
        cache_slots=slots,
        min_prefix_tokens=8,
        prefill_budget=budget,
        initial_prefill_tokens_per_s=rate,
        park=park,
        compact_lanes=compact,
        compact_min_tokens=1,
        watermarks=watermarks is not None,
        pressure_high=watermarks[0] if watermarks else 0.85,
        pressure_low=watermarks[1] if watermarks else 0.70,
        class_lanes={},
    )


def drawn_configs(lanes: int, slots: int, *, lane_ctx: int, watermarks: list[tuple[float, float] | None]) -> st.SearchStrategy[SchedulerConfig]:
    """The schedulers both nets draw: up to ``lanes`` lanes and ``slots`` prefix slots, a
    prefill budget and tick rate from chunked to whole prompts, parking and lane moves on or off."""
    return st.builds(
        config_of,
        lanes=st.integers(1, lanes),
        budget=st.sampled_from([64, 96, 200, 4096]),
        rate=st.sampled_from([40.0, 64.0, 256.0, 2000.0]),
        park=st.booleans(),
        compact=st.booleans(),
        slots=st.integers(0, slots),
        lane_ctx=st.just(lane_ctx),
        watermarks=st.sampled_from(watermarks),
    )


# Engine step numbers after which a tick stops, and requests whose client leaves (by arrival
# index) at a tick: drawn by both nets.
DRAWN_STOPS = st.sets(st.integers(1, 40), max_size=5)
DRAWN_CANCELS = st.dictionaries(st.integers(0, 15), st.integers(0, 7), max_size=3)


class Harness:
    """The scheduler and the engine, tick by tick; ``stops``: engine step numbers after which the
    tick stops (an urgent arrival or a cancel between steps). A subclass's ``call`` runs a step."""

    def __init__(self, engine: Any, config: SchedulerConfig, stops: set[int]) -> None:
        self.engine, self.clock = engine, FakeClock()
        self.sched = Scheduler(config, clock=self.clock)
        self.stops = stops
        self.n_steps = 0
        self.outputs: dict[str, list[int]] = {}
        self.reasons: dict[str, str] = {}

    def call(self, step: Step) -> Any:
        return type(self.engine).forward(self.engine, step)

    def forward(self, step: Step) -> Any:
        self.n_steps += 1
        return self.call(step)

    def tick(self) -> None:
        plan = self.sched.step()
        eng = self.engine
        eng.forward = self.forward
        try:
            result = run_tick(eng, plan, lambda: self.n_steps in self.stops, self.clock)
        finally:
            del eng.forward
        self.take(self.sched.commit(result))

    def take(self, events: list[Any]) -> None:
        for event in events:
            if event.kind == "token":
                assert event.token is not None
                self.outputs.setdefault(event.job_id, []).append(event.token)
            elif event.kind == "finished":
                self.reasons[event.job_id] = str(event.reason)

    def add(self, job_id: str, prompt: list[int], a: Arrival) -> None:
        self.sched.add(Job(job_id, list(prompt), a.max_tokens, SEEDED if a.seeded else GREEDY, qos=a.qos, pin_prefix=a.pin))


def run_schedule(
    h: Harness,
    family: list[list[int]],
    plan: list[Arrival],
    *,
    reference: Callable[[list[int], int, bool], list[int]],
    same: Callable[[list[int], list[int], list[int], bool, Any], None],
    cancels: dict[int, int] | None = None,  # tick -> index of the arrival to cancel
    pressure: Mapping[int, str] | None = None,  # tick -> OS pressure level read then
    tick_s: float = 0.0,  # the fake clock's advance after each tick
) -> dict[str, int]:
    """Run ``plan`` to its end; each request's reply must be ``reference(prompt, n, seeded)``
    (``same(prompt, got, want, seeded, what)`` judges), a cancelled one's a prefix of it. The
    scheduler's and the KV pool's counters, to show what the schedule did."""
    ids = {i: f"j{i}" for i in range(len(plan))}
    pressure = pressure or {}
    for tick in itertools.count():
        for i, a in enumerate(plan):
            if a.tick == tick:
                h.add(ids[i], family[a.prompt], a)
        for i in [i for t, i in (cancels or {}).items() if t == tick]:
            if i < len(plan):
                h.sched.cancel(ids[i])
        if tick in pressure:
            h.sched.on_os_pressure(pressure[tick])
        elif tick - 1 in pressure:
            h.sched.on_os_pressure(None)
        if tick > max((a.tick for a in plan), default=0) and not h.sched.jobs:
            break
        assert tick < 2000, "the schedule did not finish"
        h.tick()
        h.clock.advance(tick_s)
    h.take(h.sched.drain_events())  # a cancel after the last tick
    for i, a in enumerate(plan):
        got = h.outputs.get(ids[i], [])
        want = reference(family[a.prompt], a.max_tokens, a.seeded)
        if h.reasons.get(ids[i]) == "cancelled":
            assert got == want[: len(got)], (i, a)
        else:
            assert h.reasons.get(ids[i]) == "length", (i, a, h.reasons.get(ids[i]))
            same(family[a.prompt], got, want, a.seeded, (i, a))
    return {**h.sched.counters, **h.sched.pool.counters}


@dataclass(frozen=True)
class Net:
    """One engine's differential net: ``run`` runs a plan (:func:`run_schedule`) from an empty
    engine and leaves it empty. ``empty(engine)`` empties every lane and cache slot; the
    references are made up to ``max_tokens``; ``harness(engine, config, stops, aborts)`` is the
    engine's :class:`Harness`; ``same(engine, prompt, got, want, seeded, what)`` judges a reply;
    the fake clock moves on ``tick_s`` after each tick."""

    empty: Callable[[Any], None]
    max_tokens: int
    harness: Callable[[Any, SchedulerConfig, set[int], set[int]], Harness]
    same: Callable[[Any, list[int], list[int], list[int], bool, Any], None]
    tick_s: float = 0.0

    def run(
        self,
        engine: Any,
        family: list[list[int]],
        config: SchedulerConfig,
        plan: list[Arrival],
        *,
        stops: set[int] = frozenset(),  # type: ignore[assignment]
        aborts: set[int] = frozenset(),  # type: ignore[assignment]
        cancels: dict[int, int] | None = None,  # tick -> index of the arrival to cancel
        pressure: Mapping[int, str] | None = None,  # tick -> OS pressure level read then
    ) -> dict[str, int]:
        self.empty(engine)
        h = self.harness(engine, config, set(stops), set(aborts))

        def same(prompt: list[int], got: list[int], want: list[int], seeded: bool, what: Any) -> None:
            self.same(engine, prompt, got, want, seeded, what)

        reference = references(engine, self.empty, self.max_tokens)
        counters = run_schedule(h, family, plan, reference=reference, same=same, cancels=cancels, pressure=pressure, tick_s=self.tick_s)
        self.empty(engine)
        return counters
