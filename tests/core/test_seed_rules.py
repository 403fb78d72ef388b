"""Rules of the scheduling seed that the first scheduler bent (issue 15): preemption under lane
caps, the start deadline of a started completion, decode budgets and multi-round ticks, aging
that never preempts, and pressure that acts on rises only."""

from __future__ import annotations

from scheduler.core.qos import QosClass
from scheduler.core.scheduler import Scheduler
from scheduler.engines.sim import FakeClock, SimEngine

from .builders import finished, make_job, make_scheduler, outputs, run_until_idle, tick


def interactive_lanes(sched) -> int:  # type: ignore[no-untyped-def]
    return sum(1 for j in sched.lanes if j is not None and j.qos is QosClass.INTERACTIVE)


# -- 1. preemption --------------------------------------------------------------------


def test_preemption_never_gives_a_class_more_lanes_than_its_cap() -> None:
    sched, engine, _ = make_scheduler(max_batch=2, class_lanes={QosClass.INTERACTIVE: 1})
    for i in range(2):
        sched.add(make_job(job_id=f"bg{i}", qos=QosClass.BACKGROUND, max_tokens=200))
    tick(sched, engine)
    tick(sched, engine)
    sched.add(make_job(job_id="chat1", qos=QosClass.INTERACTIVE, max_tokens=20))
    sched.add(make_job(job_id="chat2", qos=QosClass.INTERACTIVE, max_tokens=20))
    events = []
    while sched.jobs:
        events += tick(sched, engine)
        assert interactive_lanes(sched) <= 1
    assert finished(events)["chat1"] == finished(events)["chat2"] == "length"
    assert sched.counters["preemptions"] == 1  # one background lane gave way, not two


def test_preemption_takes_urgent_jobs_in_score_order() -> None:
    sched, engine, _ = make_scheduler(max_batch=1)
    sched.add(make_job(job_id="bg", qos=QosClass.BACKGROUND, max_tokens=200))
    tick(sched, engine)
    sched.add(make_job(job_id="low", qos=QosClass.INTERACTIVE, priority=-10, max_tokens=4))
    sched.add(make_job(job_id="high", qos=QosClass.INTERACTIVE, priority=10, max_tokens=4))
    plan = sched.step()
    assert [b.job_id for b in plan.bind] == ["high"]


def test_preemption_keeps_the_batch_invariant_wait_rule() -> None:
    """While a batch-invariant interactive job waits, no other interactive job takes a lane by
    preemption before it (it would otherwise hold the lane the invariant job needs)."""
    sched, engine, _ = make_scheduler(max_batch=1)
    sched.add(make_job(job_id="bg", qos=QosClass.BACKGROUND, max_tokens=200))
    tick(sched, engine)
    sched.add(make_job(job_id="plain", qos=QosClass.INTERACTIVE, max_tokens=4))
    sched.add(make_job(job_id="invariant", qos=QosClass.INTERACTIVE, max_tokens=4, batch_invariant=True))
    plan = sched.step()
    assert [b.job_id for b in plan.bind] == ["invariant"]


def test_an_aged_job_never_preempts() -> None:
    """Aging orders admission into free lanes only: a background job that counts as
    interactive after a long wait does not take a running agent's lane."""
    sched, engine, clock = make_scheduler(max_batch=1, starvation_ticks=1)
    sched.add(make_job(job_id="agent", max_tokens=10_000))
    sched.add(make_job(job_id="bg", qos=QosClass.BACKGROUND, max_tokens=4))
    tick(sched, engine)
    clock.advance(60)
    assert sched.queues.effective_class(sched.jobs["bg"], clock()) == QosClass.INTERACTIVE
    for _ in range(5):
        tick(sched, engine)
    assert sched.jobs["agent"].lane == 0 and sched.counters["preemptions"] == 0


def aged_background_admitted_ahead_of_a_completion(bg_tokens: int) -> tuple[Scheduler, SimEngine, FakeClock]:
    """One lane held by a chat; a background job waits 6.5 s (3 s aging periods: it counts
    as completion), then a completion job arrives and the chat ends: aging gives the lane to
    the background job, ahead of the completion job."""
    sched, engine, clock = make_scheduler(max_batch=1, starvation_ticks=3, tick_target_ms=1000)
    sched.add(make_job(job_id="chat", qos=QosClass.INTERACTIVE, max_tokens=10_000))
    sched.add(make_job(job_id="bg", qos=QosClass.BACKGROUND, max_tokens=bg_tokens))
    tick(sched, engine)
    clock.advance(6.5)
    sched.add(make_job(job_id="fim", qos=QosClass.COMPLETION, max_tokens=4))
    sched.cancel("chat")
    plan = sched.step()
    assert [b.job_id for b in plan.bind] == ["bg"]
    sched.commit(engine.execute(plan, lambda: False))
    return sched, engine, clock


def test_a_job_aging_admitted_ahead_of_a_completion_is_not_preempted_by_it_at_the_next_tick() -> None:
    """The completion job it beat does not take the lane back at the next tick: that would
    undo aging (and the background job, its wait intact, would win the next free lane again)."""
    sched, engine, _ = aged_background_admitted_ahead_of_a_completion(bg_tokens=4)
    events = run_until_idle(sched, engine)
    assert sched.counters["preemptions"] == 0
    assert [e.job_id for e in events if e.kind == "admitted"] == ["fim"]
    assert [e.job_id for e in events if e.kind == "finished"] == ["bg", "fim"]


def test_the_job_it_beat_preempts_it_once_its_own_wait_would_have_won_and_its_aging_survives() -> None:
    """The completion job ages too: one period later it counts as interactive, which the
    background job's admission (as completion) does not beat, and it preempts. The background
    job's wait (6.5 s) still counts after the preemption, so it counts as completion at once and
    wins the next free lane from a completion job that arrived after it was preempted; it is
    preempted once, not at every tick."""
    sched, engine, clock = aged_background_admitted_ahead_of_a_completion(bg_tokens=10_000)
    fim_added = sched.jobs["fim"].enqueued_s
    while sched.counters["preemptions"] == 0:
        tick(sched, engine)
        assert clock() - fim_added < 3.5
    assert clock() - fim_added >= 3.0
    bg = sched.jobs["bg"]
    assert sched.queues.effective_class(bg, clock()) == QosClass.COMPLETION
    sched.add(make_job(job_id="fim2", qos=QosClass.COMPLETION, max_tokens=4))
    sched.cancel("fim")
    plan = sched.step()
    assert [b.job_id for b in plan.bind] == ["bg"]
    sched.commit(engine.execute(plan, lambda: False))
    for _ in range(5):
        tick(sched, engine)
    assert sched.counters["preemptions"] == 1 and bg.lane == 0


# -- 2. completion start deadline -------------------------------------------------------


def test_a_started_completion_past_its_deadline_is_not_killed_by_a_preemption() -> None:
    sched, engine, clock = make_scheduler(max_batch=1)
    fim = make_job(job_id="fim", qos=QosClass.COMPLETION, max_tokens=30)
    fim.deadline_s = clock() + 0.5
    sched.add(fim)
    tick(sched, engine)
    tick(sched, engine)
    sched.add(make_job(job_id="chat", qos=QosClass.INTERACTIVE, max_tokens=10))
    events = tick(sched, engine)
    assert any(e.kind == "preempted" and e.job_id == "fim" for e in events)
    clock.advance(5)  # well past the start deadline while it waits for its lane again
    events += run_until_idle(sched, engine)
    assert finished(events)["fim"] == "length"
    assert sched.counters["deadline_expired"] == 0


# -- 3. decode budget and multi-round ticks ---------------------------------------------


def test_tick_decode_budget_rotates_so_equal_lanes_get_equal_tokens() -> None:
    sched, engine, _ = make_scheduler(max_batch=3, tick_decode_budget=2)
    for i in range(3):
        sched.add(make_job(job_id=f"s{i}", max_tokens=60))
    events = []
    for _ in range(25):
        events += tick(sched, engine)
    counts = sorted(len(v) for v in outputs(events).values())
    assert len(counts) == 3 and counts[-1] - counts[0] <= 1
    done_at: dict[str, int] = {}
    n = 25
    while sched.jobs:
        n += 1
        for e in tick(sched, engine):
            if e.kind == "finished":
                done_at[e.job_id] = n
    assert max(done_at.values()) <= 1.2 * min(done_at.values())


def test_with_a_decode_budget_a_lower_class_lane_is_served_after_starvation_ticks_from_its_first_wait() -> None:
    """A budget of one token a tick, an interactive lane and a background one: the background
    lane gets a token at least every --starvation-ticks ticks. A lane that had never had a grant
    counted as never idle, so one that finished its prefill beside a better class was starved
    for good (1 token in 100 ticks)."""
    sched, engine, _ = make_scheduler(max_batch=2, tick_decode_budget=1, starvation_ticks=8)
    sched.add(make_job(job_id="chat", qos=QosClass.INTERACTIVE, max_tokens=500))
    sched.add(make_job(job_id="bg", qos=QosClass.BACKGROUND, max_tokens=500))
    events = []
    for _ in range(100):
        events += tick(sched, engine)
    counts = {k: len(v) for k, v in outputs(events).items()}
    assert counts["bg"] >= 100 // 9 and counts["chat"] > counts["bg"], counts


def test_tick_decode_budget_zero_decodes_every_lane_every_round() -> None:
    sched, engine, _ = make_scheduler(max_batch=4, tick_targets_s=(0.05, 0.25), decode_round_s=0.02)
    for i in range(4):
        sched.add(make_job(job_id=f"s{i}", max_tokens=100))
    tick(sched, engine)
    for _ in range(20):
        plan = sched.step()
        assert plan.decode_tokens == 4
        sched.commit(engine.execute(plan, lambda: False))


def busy_scheduler(**kw):  # type: ignore[no-untyped-def]
    sched, engine, clock = make_scheduler(max_batch=2, tick_targets_s=(0.05, 0.25), decode_round_s=0.02, **kw)
    for i in range(2):
        sched.add(make_job(job_id=f"s{i}", max_tokens=1000))
    tick(sched, engine)  # prefill: a tick of its own
    return sched, engine, clock


def test_busy_ticks_on_llama_cpp_and_mlx_are_several_rounds_near_250_ms() -> None:
    sched, engine, clock = busy_scheduler()
    start_tick, start = sched.tick, clock()
    for _ in range(120):
        tick(sched, engine)
    ticks = sched.tick - start_tick
    assert 8 <= ticks <= 12  # 120 rounds of 20 ms = 2.4 s of ~250 ms ticks
    assert (clock() - start) / ticks <= 0.25 + 1e-9


def test_ticks_are_near_50_ms_while_a_lane_is_free() -> None:
    sched, engine, clock = make_scheduler(max_batch=2, tick_targets_s=(0.05, 0.25), decode_round_s=0.02)
    sched.add(make_job(job_id="s0", max_tokens=1000))
    tick(sched, engine)
    start_tick = sched.tick
    for _ in range(60):
        tick(sched, engine)
    assert 25 <= sched.tick - start_tick <= 35  # two 20 ms rounds a tick


def test_an_urgent_arrival_ends_a_multi_round_tick_at_the_next_round() -> None:
    sched, engine, clock = busy_scheduler()
    tick(sched, engine)
    sched.add(make_job(job_id="chat", qos=QosClass.INTERACTIVE, max_tokens=4))
    plan = sched.step()
    assert [b.job_id for b in plan.bind] == ["chat"]  # a new tick: it preempted at once


def test_a_finished_lane_ends_the_tick_so_the_next_job_is_admitted_at_once() -> None:
    sched, engine, clock = make_scheduler(max_batch=2, tick_targets_s=(0.05, 0.25), decode_round_s=0.02)
    sched.add(make_job(job_id="long", max_tokens=1000))
    sched.add(make_job(job_id="short", max_tokens=3))
    sched.add(make_job(job_id="next", max_tokens=3))
    admitted_round = None
    finished_round = None
    for _ in range(20):
        events = tick(sched, engine)
        if finished_round is None and any(e.kind == "finished" and e.job_id == "short" for e in events):
            finished_round = sched.rounds
        if any(e.kind == "admitted" and e.job_id == "next" for e in events):
            admitted_round = sched.rounds
            break
    assert finished_round is not None and admitted_round == finished_round + 1


# -- 5. OS pressure: rises, not readings ------------------------------------------------


def test_a_warning_that_stays_evicts_once_not_every_reading() -> None:
    sched, engine, clock = make_scheduler(max_batch=2, lane_ctx=256, cache_slots=4)
    for k in range(4):
        job = make_job(5, job_id=f"p{k}", max_tokens=2)
        job.prompt = [100 + k] * 80 + job.prompt
        job.pin_prefix = True
        sched.add(job)
        run_until_idle(sched, engine)
    assert len(sched.pool.device_entries()) == 4
    for _ in range(10):
        sched.on_os_pressure("warning")  # the same reading, once a second
        clock.advance(1)
        tick(sched, engine)
    assert sched.counters["os_pressure_warning"] == 1
    assert len(sched.pool.device_entries()) == 3  # one eviction round (already below the low mark)
    sched.on_os_pressure("normal")
    sched.on_os_pressure("warning")  # a new rise acts again
    tick(sched, engine)
    assert sched.counters["os_pressure_warning"] == 2
    sched.on_os_pressure("critical")  # warning to critical is a rise too
    tick(sched, engine)
    assert sched.counters["os_pressure_critical"] == 1
