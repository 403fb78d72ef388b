"""A seeded reply under a grammar (``response_format: json_schema``) is the same whether or not
its job was preempted, on both engines, whether the preemption parked its KV or dropped it (no
parking, or critical OS memory pressure, which never parks) and it was computed again: the
lane's random stream must go on from where it was. On llama.cpp a pick the grammar rejects makes
the chain draw again, so the stream is not simply one draw per token; on MLX the grammar masks
before the one draw. The real scheduler plans the ticks on a fake clock."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from scheduler.core.kv_pool import PoolOps
from scheduler.core.qos import QosClass
from scheduler.core.scheduler import Scheduler, SchedulerConfig
from scheduler.core.types import Job, SamplingParams, TickPlan
from scheduler.engines.base import run_tick
from scheduler.engines.grammar import schema_grammar
from scheduler.engines.sim import FakeClock
from testkit.engine_driver import chat, never

pytestmark = pytest.mark.model

N_LANES, SLOTS, LANE_CTX = 1, 0, 512
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name", "age"],
}
HOT = SamplingParams(temperature=1.0, seed=77, grammar=schema_grammar(PERSON))
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module", params=["llamacpp", "mlx"])
def engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "llamacpp":
        from scheduler.engines.llama_cpp import LlamaCppEngine
        from scheduler.engines.models import default_model_path

        eng: Any = LlamaCppEngine(default_model_path(), n_lanes=N_LANES, lane_ctx=LANE_CTX, cache_slots=SLOTS)
    else:
        from scheduler.engines.mlx import MlxEngine

        folder: Path = request.getfixturevalue("mlx_float_dir")
        eng = MlxEngine(folder, n_lanes=N_LANES, lane_ctx=LANE_CTX, cache_slots=SLOTS)
    with closing(eng):
        yield eng


def serve(engine: Any, *, park: bool, urgent_at: int | None, pressure_at: int | None = None) -> tuple[list[int], dict[str, int]]:
    """One background job, seeded and constrained, in the only lane; an interactive one arriving
    at tick ``urgent_at`` preempts it; critical OS pressure read at tick ``pressure_at`` drops
    it. Its output, and the scheduler's counters."""
    engine.execute(TickPlan(tick=0, release=list(range(N_LANES)), pool=PoolOps()), never)
    config = SchedulerConfig(
        max_batch=N_LANES, lane_ctx=LANE_CTX, cache_slots=SLOTS, prefill_budget=4096, park=park,
        watermarks=False, class_lanes={}, initial_prefill_tokens_per_s=2000.0,
    )
    config.abortable_steps = False
    clock = FakeClock()
    sched = Scheduler(config, clock=clock)
    sched.add(Job("g", chat(engine, "Describe a person as JSON."), 40, HOT, qos=QosClass.BACKGROUND))
    out: list[int] = []
    for tick in itertools.count():
        assert tick < 500
        if tick == urgent_at:
            sched.add(Job("u", chat(engine, "Say hi."), 3, GREEDY, qos=QosClass.INTERACTIVE))
        if tick == pressure_at:
            sched.on_os_pressure("critical")
        elif pressure_at is not None and tick == pressure_at + 1:
            sched.on_os_pressure(None)
        if not sched.jobs:
            break
        events = sched.commit(run_tick(engine, sched.step(), never, clock))
        out += [e.token for e in events if e.kind == "token" and e.job_id == "g" and e.token is not None]
        clock.advance(1.0)  # past the hold on background jobs after critical pressure (5 s)
    return out, {**sched.counters}


@pytest.fixture(scope="module")
def alone(engine: Any) -> list[int]:
    out, counters = serve(engine, park=True, urgent_at=None)
    assert counters["preemptions"] == 0 and len(out) > 8
    return out


@pytest.mark.parametrize("park", [True, False], ids=["parked", "dropped"])
def test_a_seeded_constrained_reply_preempted_is_the_reply_it_gives_alone(engine: Any, alone: list[int], park: bool) -> None:
    out, counters = serve(engine, park=park, urgent_at=6)
    assert counters["preemptions"] == 1 and counters["parks"] == (1 if park else 0)
    assert out == alone


def test_a_seeded_constrained_reply_dropped_by_critical_pressure_is_the_reply_it_gives_alone(engine: Any, alone: list[int]) -> None:
    out, counters = serve(engine, park=True, urgent_at=None, pressure_at=6)
    assert counters["preemptions"] == 1 and counters["parks"] == 0
    assert out == alone
