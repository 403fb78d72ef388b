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


def test_only_a_move_worth_its_copy_is_made() -> None:
    # when j1 (lane 1) finishes, lanes 0, 2 and 3 are busy: one move makes them one run, j3 into
    # lane 1 or j0 into lane 1; j3 has 8 tokens left, fewer than compact_min_tokens, so j0 moves
    sched, engine, _ = setup(True, [40, 4, 40, 12], compact_min_tokens=16)
    events, rounds = run(sched, engine)
    assert [(e.job_id, e.lane) for e in events if e.kind == "moved"] == [("j0", 1)]
    assert all(runs(r) == 1 for r in rounds)
    # with both ends short (8 tokens left each) no move is worth it: two passes until they end
    sched, engine, _ = setup(True, [12, 4, 40, 12], compact_min_tokens=16)
    events, rounds = run(sched, engine)
    assert not [e for e in events if e.kind == "moved"]
    assert [runs(r) for r in rounds].count(2) == 8
    # the bar rises with the KV a move copies: 16 tokens left per 512 tokens of it
    sched, engine, _ = setup(True, [40, 4, 40, 40], compact_min_tokens=16)
    sched.config.lane_ctx = 4096
    for job in sched.jobs.values():
        job.prompt = job.prompt * 40  # 640 tokens: a move copies ~644, so 20 tokens left are needed
        job.max_tokens = 20 + (4 if job.job_id == "j1" else 0)
    events, _ = run(sched, engine)
    assert not [e for e in events if e.kind == "moved"]


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


def test_the_fewest_moves_that_make_one_run_are_made() -> None:
    # lanes 1 and 3 finish together: 0, 2, 4, 5 busy; filling lanes 2-5 takes one move (j0 into
    # lane 3) where filling 0-3 would take two
    sched, engine, _ = setup(True, [40, 3, 40, 3, 40, 40])
    events, rounds = run(sched, engine)
    assert [(e.job_id, e.lane) for e in events if e.kind == "moved"] == [("j0", 3)]
    assert all(runs(r) == 1 for r in rounds)


def test_a_later_window_needing_more_moves_is_not_taken() -> None:
    # lanes 3 and 5 finish together: 0, 1, 2, 4 busy; windows 0-3 and 1-4 take one move each,
    # 2-5 two. The lowest of the fewest, 0-3: j4 into lane 3. (In the test above the fewest-move
    # window is also the last one that fits, so it held with the fewest-moves rule removed.)
    sched, engine, _ = setup(True, [40, 40, 40, 3, 40, 3])
    events, rounds = run(sched, engine)
    assert [(e.job_id, e.lane) for e in events if e.kind == "moved"] == [("j4", 3)]
    assert all(runs(r) == 1 for r in rounds)


def test_a_batch_invariant_lane_is_not_counted_in_the_others_run_and_never_moves() -> None:
    # the batch-invariant job takes lane 0 (it is admitted first) and ticks alone; when lane 1
    # finishes, lanes 2 and 3 decode together in one run already: nothing moves
    sched, engine, _ = make_scheduler(max_batch=4, compact_lanes=True)
    for i, (n, bi) in enumerate([(40, True), (4, False), (40, False), (40, False)]):
        sched.add(make_job(16, max_tokens=n, job_id=f"j{i}", batch_invariant=bi))
    events, rounds = run(sched, engine)
    assert sched.jobs == {} and sched.counters["lane_moves"] == 0
    assert [2, 3] in rounds and all(runs(r) == 1 for r in rounds)


def test_a_new_job_takes_the_free_lane_beside_the_others_so_nothing_moves_later() -> None:
    # lanes 0 and 1 finish together, 2 and 3 run on; a new job takes lane 1, not 0: lanes 1-3
    # are one run, where lane 0 would leave a gap for a move to close
    sched, engine, _ = setup(True, [4, 4, 40, 40], keep_lanes=False)
    while "j0" in sched.jobs:
        tick(sched, engine)
    late = make_job(16, max_tokens=30, job_id="late")
    sched.add(late)
    events, rounds = run(sched, engine)
    assert late.finish_reason == "length" and sched.counters["lane_moves"] == 0
    assert [e.lane for e in events if e.kind == "admitted" and e.job_id == "late"] == [1]
    assert [1, 2, 3] in rounds and all(runs(r) == 1 for r in rounds)
