"""Lane compaction: on an engine that runs a decode round in one pass over the weights per run of
consecutive busy lanes (llama.cpp with a KV stream per sequence), a running job above a free
lane moves down into it, its KV and sampler with it, and streams exactly what it would have."""

from __future__ import annotations

from typing import Any

from scheduler.core.scheduler import Scheduler
from scheduler.core.types import Event, Job, LaneSwap
from scheduler.engines.sim import SimEngine

from .builders import make_job, make_scheduler, outputs, tick


def runs(lanes: list[int]) -> int:
    """Runs of consecutive lane numbers: the passes a decode round over these lanes costs."""
    lanes = sorted(lanes)
    return sum(1 for i, lane in enumerate(lanes) if i == 0 or lane != lanes[i - 1] + 1)


def setup(compact: bool, max_tokens: list[int], **config: Any) -> tuple[Scheduler, SimEngine, list[Job]]:
    sched, engine, _ = make_scheduler(max_batch=len(max_tokens), compact_lanes=compact, **config)
    jobs = [make_job(16, max_tokens=n, job_id=f"j{i}") for i, n in enumerate(max_tokens)]
    for job in jobs:
        sched.add(job)
    return sched, engine, jobs


def run(sched: Scheduler, engine: SimEngine) -> tuple[list[Event], list[list[int]]]:
    """Every event, and the lanes of each decode round, until the scheduler is idle."""
    events: list[Event] = []
    rounds: list[list[int]] = []
    for _ in range(1000):
        if not sched.jobs:
            return events, rounds
        plan = sched.step()
        decode = [f.lane for f in plan.feeds if f.is_decode]
        if decode:
            rounds.append(decode)
        events += sched.commit(engine.execute(plan, lambda: False))
    raise AssertionError("scheduler did not go idle")


def test_a_job_above_a_finished_lane_moves_into_it_and_streams_the_same_tokens() -> None:
    lengths = [40, 4, 40, 40]  # j1, in lane 1, finishes first
    sched, engine, _ = setup(True, lengths)
    events, rounds = run(sched, engine)
    moved = [e for e in events if e.kind == "moved"]
    assert [(e.job_id, e.lane) for e in moved] == [("j3", 1)]
    assert sched.counters["lane_moves"] == 1
    # after j1 finished, every decode round is one run of lanes
    assert all(runs(r) == 1 for r in rounds)
    assert max(runs(r) for r in rounds) == 1
    # the tokens are those of a run without compaction, where the round ran lanes 0, 2, 3
    plain, engine_plain, _ = setup(False, lengths)
    events_plain, rounds_plain = run(plain, engine_plain)
    assert outputs(events) == outputs(events_plain)
    assert any(runs(r) == 2 for r in rounds_plain)
    assert {e.job_id: e.reason for e in events if e.kind == "finished"} == {f"j{i}": "length" for i in range(4)}


def test_the_kept_kv_in_the_gap_trades_places_and_still_serves_its_conversation() -> None:
    sched, engine, jobs = setup(True, [40, 4, 40, 40], min_prefix_tokens=8)
    while "j1" in sched.jobs:
        tick(sched, engine)
    kept_tokens = jobs[1].sequence[: jobs[1].computed]
    plan = sched.step()
    assert plan.swap == [LaneSwap(3, 1, True)]
    sched.commit(engine.execute(plan, lambda: False))
    assert sched.lanes[1] is jobs[3] and jobs[3].lane == 1 and sched.lanes[3] is None
    assert engine.kv[3] == kept_tokens  # the finished job's KV, now in lane 3
    assert engine.kv[1][: len(jobs[3].prompt)] == jobs[3].prompt
    assert engine.lane_job[1] == "j3" and engine.lane_job[3] is None
    # the conversation's next turn takes lane 3 and prefills only what is new
    follow = Job(job_id="turn2", prompt=kept_tokens + [7, 8, 9], max_tokens=2, sampling=jobs[1].sampling, qos=jobs[1].qos)
    sched.add(follow)
    tick(sched, engine)
    assert follow.lane == 3 and follow.cached_tokens == len(kept_tokens)


def test_a_job_with_few_tokens_left_stays_where_it_is() -> None:
    # j3 has 6 tokens left when j1 finishes: fewer than compact_min_tokens, not worth the copy;
    # once j3 has finished, j2 (lanes 0 and 2 busy) moves into lane 1
    sched, engine, _ = setup(True, [40, 4, 40, 10], compact_min_tokens=16)
    events, rounds = run(sched, engine)
    kinds = [(e.kind, e.job_id) for e in events if e.kind in ("moved", "finished")]
    assert kinds[:3] == [("finished", "j1"), ("finished", "j3"), ("moved", "j2")]
    assert [e.lane for e in events if e.kind == "moved"] == [1]
    assert [runs(r) for r in rounds].count(2) == 6  # j3's last six rounds, beside lanes 0 and 2


def test_off_without_the_engine_capability_and_for_batch_invariant_jobs() -> None:
    sched, engine, _ = setup(False, [40, 4, 40, 40])
    events, _ = run(sched, engine)
    assert sched.counters["lane_moves"] == 0
    sched, engine, _ = make_scheduler(max_batch=3, compact_lanes=True)
    short = make_job(16, max_tokens=4, job_id="short")
    bi = make_job(16, max_tokens=40, job_id="bi", batch_invariant=True)
    sched.add(make_job(16, max_tokens=40, job_id="first"))
    sched.add(short)
    sched.add(bi)
    events, _ = run(sched, engine)
    assert bi.finish_reason == "length" and not [e for e in events if e.kind == "moved"]


def test_moves_fill_several_gaps_highest_lane_first() -> None:
    sched, engine, jobs = setup(True, [40, 3, 40, 3, 40, 40])
    events, rounds = run(sched, engine)
    assert [(e.job_id, e.lane) for e in events if e.kind == "moved"] == [("j5", 1), ("j4", 3)]
    assert all(runs(r) == 1 for r in rounds)
