"""Differential KV-cache tests on the real llama.cpp engine (SmolLM2-135M): the real scheduler
plans ticks for a mix of greedy requests whose prompts share prefixes with each other (the same
prompt again, one identical but its last token, one longer by a token, extensions, a half
share), under schedule shapes Hypothesis draws (lanes, prefill budget and step, parking on or
off, lane compaction, urgent arrivals that preempt, cancels, aborted and stopped steps, OS
memory pressure evicting cached prefixes to host memory); every request must get, token for
token, what it gets alone in an empty lane. The scheduler's clock is a fake one and the engine
runs its ticks on it too, so the plans do not depend on how fast this machine is."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.kv_pool import PoolOps
from scheduler.core.qos import QosClass
from scheduler.core.scheduler import SchedulerConfig
from scheduler.core.types import TickPlan
from scheduler.engines.base import Step
from testkit.engine_driver import never

from .differential import DRAWN_CANCELS, DRAWN_STOPS, Arrival, Harness, Net, arrivals, drawn_configs, make_family
from .differential import config_of as shared_config

pytestmark = pytest.mark.model

N_LANES, SLOTS, LANE_CTX = 4, 2, 512


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.engines.models import default_model_path

    eng = LlamaCppEngine(default_model_path(), n_lanes=N_LANES, lane_ctx=LANE_CTX, cache_slots=SLOTS)
    with closing(eng):
        yield eng


def _empty(engine: Any) -> None:
    engine.clear_abort()
    engine.execute(TickPlan(tick=0, release=list(range(N_LANES)), pool=PoolOps(drop=[N_LANES + i for i in range(SLOTS)])), never)


@pytest.fixture(scope="module")
def family(engine: Any) -> list[list[int]]:
    return make_family(engine)


class Aborting(Harness):
    """Steps abortable as llama.cpp's are: ``aborts`` are engine step numbers whose prompt step
    is aborted for real (``abort_step``), as a cancel or an urgent arrival during it does."""

    def __init__(self, engine: Any, config: SchedulerConfig, stops: set[int], aborts: set[int]) -> None:
        config.abortable_steps = True
        config.compact_lanes = config.compact_lanes and engine.compact_lanes
        super().__init__(engine, config, stops)
        self.aborts = aborts

    def call(self, step: Step) -> Any:
        if self.n_steps in self.aborts and step.prefill:
            self.engine.abort_step()
        try:
            return super().call(step)
        finally:
            self.engine.clear_abort()


def _exactly(engine: Any, prompt: list[int], got: list[int], want: list[int], seeded: bool, what: Any) -> None:
    assert got == want, (what, got, want)


run_schedule = Net(empty=_empty, max_tokens=12, harness=Aborting, same=_exactly).run


def config_of(lanes: int, budget: int, rate: float, park: bool, compact: bool, slots: int) -> SchedulerConfig:
    return shared_config(lanes, budget, rate, park, compact, slots, lane_ctx=LANE_CTX)


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
    plan=st.lists(arrivals(12), min_size=1, max_size=8),
    config=drawn_configs(N_LANES, SLOTS, lane_ctx=LANE_CTX, watermarks=[None]),
    aborts=st.sets(st.integers(1, 40), max_size=5),
    stops=DRAWN_STOPS,
    cancels=DRAWN_CANCELS,
    pressure=st.sets(st.integers(0, 15), max_size=2),
)
def test_any_schedule_gives_every_request_the_reply_it_gets_alone(
    engine: Any, family: list[list[int]], plan: list[Arrival], config: SchedulerConfig, aborts: set[int], stops: set[int], cancels: dict[int, int], pressure: set[int]
) -> None:
    run_schedule(engine, family, config, plan, aborts=aborts, stops=stops, cancels=cancels, pressure=dict.fromkeys(pressure, "warning"))


def test_a_follower_whose_leader_ends_at_its_first_token_copies_the_prefix_from_its_kept_lane(engine: Any, family: list[list[int]]) -> None:
    """The leader prefills in 64-token steps and ends at its first token (max_tokens 1); the
    follower, which waited for that prefix, copies it from the leader's kept lane and replies
    as it does alone."""
    plan = [Arrival(0, 0, 1, QosClass.AGENT, False), Arrival(0, 3, 6, QosClass.AGENT, False)]
    counters = run_schedule(engine, family, config_of(2, 64, 64.0, True, False, 2), plan)
    assert counters["prefix_tokens_reused"] >= len(family[0]) - 1


def test_a_pinned_warm_up_request_with_max_tokens_1_pins_its_prompt_and_a_later_one_is_seeded_from_it(engine: Any, family: list[list[int]]) -> None:
    """One lane: a pinned request with max_tokens 1 ends in the tick its prefill completes; its
    prompt is stored pinned from the lane it left, another request takes that lane, and a later
    request extending the pinned prompt is seeded from the cache and replies as it does alone."""
    plan = [Arrival(0, 0, 1, QosClass.AGENT, True), Arrival(3, 5, 4, QosClass.AGENT, False), Arrival(12, 3, 6, QosClass.AGENT, False)]
    counters = run_schedule(engine, family, config_of(1, 4096, 2000.0, True, False, 2), plan)
    assert counters["stored"] == 1
    assert counters["prefix_tokens_reused"] >= len(family[0]) - 1
