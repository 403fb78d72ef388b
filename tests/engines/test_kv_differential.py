"""Differential KV-cache tests on the real llama.cpp engine (SmolLM2-135M): the real scheduler
plans ticks for a mix of greedy requests whose prompts share prefixes with each other (the same
prompt again, one identical but its last token, one longer by a token, extensions, a half
share), under schedule shapes Hypothesis draws (lanes, prefill budget and step, parking on or
off, lane compaction, urgent arrivals that preempt, cancels, aborted and stopped steps, OS
memory pressure evicting cached prefixes to host memory); every request must get, token for
token, what it gets alone in an empty lane. The scheduler's clock is a fake one and the engine
runs its ticks on it too, so the plans do not depend on how fast this machine is."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.kv_pool import PoolOps
from scheduler.core.qos import QosClass
from scheduler.core.scheduler import Scheduler, SchedulerConfig
from scheduler.core.types import Job, SamplingParams, TickPlan
from scheduler.engines.base import Step, run_tick
from scheduler.engines.sim import FakeClock
from testkit.engine_driver import chat, generate, never, release

pytestmark = pytest.mark.model

N_LANES, SLOTS, LANE_CTX = 4, 2, 512
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, top_k=40, seed=11, ignore_eos=True)


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.engines.models import default_model_path

    eng = LlamaCppEngine(default_model_path(), n_lanes=N_LANES, lane_ctx=LANE_CTX, cache_slots=SLOTS)
    try:
        yield eng
    finally:
        eng.close()


def _empty(engine: Any) -> None:
    engine.clear_abort()
    engine.execute(TickPlan(tick=0, release=list(range(N_LANES)), pool=PoolOps(drop=[N_LANES + i for i in range(SLOTS)])), never)


@pytest.fixture(scope="module")
def family(engine: Any) -> list[list[int]]:
    return make_family(engine)


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


_reference: dict[tuple[bool, tuple[int, ...]], list[int]] = {}


def reference(engine: Any, prompt: list[int], n: int, seeded: bool = False) -> list[int]:
    """The prompt's reply (greedy, or seeded) generated alone in an empty lane 0."""
    key = (seeded, tuple(prompt))
    if len(_reference.get(key, [])) < n:
        _empty(engine)
        _reference[key] = generate(engine, 0, prompt, SEEDED if seeded else GREEDY, max_tokens=12)
        release(engine, 0)
    return _reference[key][:n]


@dataclass
class Arrival:
    tick: int
    prompt: int  # index into the family
    max_tokens: int
    qos: QosClass
    pin: bool
    seeded: bool = False


arrivals = st.builds(
    Arrival,
    tick=st.integers(0, 12),
    prompt=st.integers(0, 5),
    max_tokens=st.integers(1, 12),
    qos=st.sampled_from([QosClass.INTERACTIVE, QosClass.AGENT, QosClass.BACKGROUND]),
    pin=st.booleans(),
    seeded=st.booleans(),
)


class Harness:
    def __init__(self, engine: Any, config: SchedulerConfig, aborts: set[int], stops: set[int]) -> None:
        self.engine, self.clock = engine, FakeClock()
        config.abortable_steps = True
        config.compact_lanes = config.compact_lanes and engine.compact_lanes
        self.sched = Scheduler(config, clock=self.clock)
        self.aborts, self.stops = aborts, stops  # engine step numbers to abort / stop after
        self.n_steps = 0
        self.outputs: dict[str, list[int]] = {}
        self.reasons: dict[str, str] = {}
        self.jobs: dict[str, Job] = {}

    def forward(self, step: Step) -> Any:
        self.n_steps += 1
        if self.n_steps in self.aborts and step.prefill:
            self.engine.abort_step()  # as a cancel or an urgent arrival during the step does
        try:
            return type(self.engine).forward(self.engine, step)
        finally:
            self.engine.clear_abort()

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
        job = Job(job_id, list(prompt), a.max_tokens, SEEDED if a.seeded else GREEDY, qos=a.qos, pin_prefix=a.pin)
        self.jobs[job_id] = job
        self.sched.add(job)


def run_schedule(
    engine: Any,
    family: list[list[int]],
    config: SchedulerConfig,
    plan: list[Arrival],
    *,
    aborts: set[int] = frozenset(),  # type: ignore[assignment]
    stops: set[int] = frozenset(),  # type: ignore[assignment]
    cancels: dict[int, int] | None = None,  # tick -> index of the arrival to cancel
    pressure: set[int] = frozenset(),  # type: ignore[assignment]
) -> dict[str, int]:
    _empty(engine)
    h = Harness(engine, config, set(aborts), set(stops))
    ids = {i: f"j{i}" for i in range(len(plan))}
    for tick in itertools.count():
        for i, a in enumerate(plan):
            if a.tick == tick:
                h.add(ids[i], family[a.prompt], a)
        for i in [i for t, i in (cancels or {}).items() if t == tick]:
            if i < len(plan):
                h.sched.cancel(ids[i])
        if tick in pressure:
            h.sched.on_os_pressure("warning")
        elif tick - 1 in pressure:
            h.sched.on_os_pressure(None)
        if tick > max((a.tick for a in plan), default=0) and not h.sched.jobs:
            break
        assert tick < 2000, "the schedule did not finish"
        h.tick()
    h.take(h.sched.drain_events())  # a cancel after the last tick
    for i, a in enumerate(plan):
        got = h.outputs.get(ids[i], [])
        want = reference(engine, family[a.prompt], a.max_tokens, a.seeded)
        if h.reasons.get(ids[i]) == "cancelled":
            assert got == want[: len(got)], (i, a)
        else:
            assert h.reasons.get(ids[i]) == "length", (i, a, h.reasons.get(ids[i]))
            assert got == want, (i, a, got, want)
    _empty(engine)
    return {**h.sched.counters, **h.sched.pool.counters}


def config_of(lanes: int, budget: int, rate: float, park: bool, compact: bool, slots: int) -> SchedulerConfig:
    return SchedulerConfig(
        max_batch=lanes,
        lane_ctx=LANE_CTX,
        cache_slots=slots,
        min_prefix_tokens=8,
        prefill_budget=budget,
        initial_prefill_tokens_per_s=rate,
        park=park,
        compact_lanes=compact,
        compact_min_tokens=1,
        watermarks=False,
        class_lanes={},
    )


# -- hand-made schedules ---------------------------------------------------------------------


@pytest.mark.parametrize("budget", [64, 100, 4096])
def test_every_prefix_relation_served_from_kept_lanes_and_the_cache_replies_as_alone(
    engine: Any, family: list[list[int]], budget: int
) -> None:
    """One lane at a time: each prompt of the family meets the last one's kept KV (and the
    cached prefixes the pins left), chunked by the budget."""
    plan = [Arrival(i, p, 6, QosClass.AGENT, pin=(i % 2 == 0)) for i, p in enumerate([0, 0, 1, 2, 3, 0, 4, 5, 2, 1, 0])]
    run_schedule(engine, family, config_of(1, budget, 64.0, True, False, SLOTS), plan)


@pytest.mark.parametrize("park", [True, False])
def test_preempted_requests_reply_as_alone(engine: Any, family: list[list[int]], park: bool) -> None:
    plan = [Arrival(0, p, 10, QosClass.BACKGROUND, pin=False) for p in (0, 3)]
    plan += [Arrival(t, p, 4, QosClass.INTERACTIVE, pin=False) for t, p in ((3, 2), (4, 1), (9, 5))]
    run_schedule(engine, family, config_of(2, 64, 64.0, park, False, SLOTS), plan)


def test_aborted_and_stopped_steps_leave_nothing_stale(engine: Any, family: list[list[int]]) -> None:
    plan = [Arrival(0, p, 8, QosClass.AGENT, pin=False) for p in (0, 3, 4)]
    plan += [Arrival(2, 2, 6, QosClass.AGENT, pin=False), Arrival(6, 1, 6, QosClass.AGENT, pin=False)]
    run_schedule(engine, family, config_of(3, 64, 64.0, True, True, SLOTS), plan, aborts={1, 3, 5, 9, 12}, stops={2, 7})


def test_cancelled_lanes_kept_and_reused_reply_as_alone(engine: Any, family: list[list[int]]) -> None:
    plan = [Arrival(0, 0, 12, QosClass.AGENT, pin=False), Arrival(0, 3, 12, QosClass.AGENT, pin=False)]
    plan += [Arrival(t, p, 6, QosClass.AGENT, pin=False) for t, p in ((3, 2), (3, 1), (5, 0), (5, 3))]
    run_schedule(engine, family, config_of(2, 64, 64.0, True, True, SLOTS), plan, cancels={2: 0, 4: 1, 6: 2})


# -- drawn schedules -------------------------------------------------------------------------


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    plan=st.lists(arrivals, min_size=1, max_size=8),
    lanes=st.integers(1, N_LANES),
    budget=st.sampled_from([64, 96, 200, 4096]),
    rate=st.sampled_from([40.0, 64.0, 256.0, 2000.0]),
    park=st.booleans(),
    compact=st.booleans(),
    slots=st.integers(0, SLOTS),
    aborts=st.sets(st.integers(1, 40), max_size=5),
    stops=st.sets(st.integers(1, 40), max_size=5),
    cancels=st.dictionaries(st.integers(0, 15), st.integers(0, 7), max_size=3),
    pressure=st.sets(st.integers(0, 15), max_size=2),
)
def test_any_schedule_gives_every_request_the_reply_it_gets_alone(
    engine: Any,
    family: list[list[int]],
    plan: list[Arrival],
    lanes: int,
    budget: int,
    rate: float,
    park: bool,
    compact: bool,
    slots: int,
    aborts: set[int],
    stops: set[int],
    cancels: dict[int, int],
    pressure: set[int],
) -> None:
    config = config_of(lanes, budget, rate, park, compact, slots)
    run_schedule(engine, family, config, plan, aborts=aborts, stops=stops, cancels=cancels, pressure=pressure)
