"""Which queued job gets the next lane: class order, priority, arrival, lane caps, aging."""

from __future__ import annotations

import pytest

from scheduler.core.qos import QosClass
from scheduler.core.scheduler import Scheduler, SchedulerConfig
from scheduler.core.types import Event

from .builders import make_job, make_scheduler, run_until_idle, tick


def admitted_order(events: list[Event]) -> list[str]:
    return [e.job_id for e in events if e.kind == "admitted"]


def lane_classes(sched: Scheduler) -> list[QosClass | None]:
    return [job.qos if job is not None else None for job in sched.lanes]


def test_an_interactive_job_queued_after_agents_gets_the_next_free_lane() -> None:
    sched, engine, _ = make_scheduler(max_batch=1)
    running = make_job(max_tokens=3, qos=QosClass.INTERACTIVE, job_id="running")  # not preemptible
    sched.add(running)
    tick(sched, engine)
    for job_id, qos in [("agent1", QosClass.AGENT), ("agent2", QosClass.AGENT), ("chat", QosClass.INTERACTIVE)]:
        sched.add(make_job(max_tokens=2, qos=qos, job_id=job_id))
    events: list[Event] = []
    while running.finish_reason is None:
        events += tick(sched, engine)
    events += tick(sched, engine)
    assert admitted_order(events) == ["chat"]
    assert sched.lanes[0] is not None and sched.lanes[0].job_id == "chat"


def test_queued_jobs_are_admitted_best_class_first() -> None:
    sched, engine, _ = make_scheduler(max_batch=1)
    for job_id, qos in [
        ("bg", QosClass.BACKGROUND),
        ("agent", QosClass.AGENT),
        ("completion", QosClass.COMPLETION),
        ("chat", QosClass.INTERACTIVE),
    ]:
        sched.add(make_job(max_tokens=2, qos=qos, job_id=job_id))
    events = run_until_idle(sched, engine)
    assert admitted_order(events) == ["chat", "completion", "agent", "bg"]


def test_inside_a_class_higher_priority_goes_first_and_equal_priority_keeps_arrival_order() -> None:
    sched, engine, _ = make_scheduler(max_batch=1)
    for job_id, priority in [("a0", 0), ("b5", 5), ("c0", 0), ("d5", 5), ("e-3", -3), ("f100", 100)]:
        sched.add(make_job(max_tokens=2, priority=priority, job_id=job_id))
    events = run_until_idle(sched, engine)
    assert admitted_order(events) == ["f100", "b5", "d5", "a0", "c0", "e-3"]


def test_priority_does_not_lift_a_job_above_a_better_class() -> None:
    sched, engine, _ = make_scheduler(max_batch=1)
    sched.add(make_job(max_tokens=2, qos=QosClass.BACKGROUND, priority=1000, job_id="loud-bg"))
    sched.add(make_job(max_tokens=2, qos=QosClass.AGENT, priority=-1000, job_id="quiet-agent"))
    events = run_until_idle(sched, engine)
    assert admitted_order(events) == ["quiet-agent", "loud-bg"]


def test_a_background_lane_cap_keeps_background_at_two_lanes_and_leaves_the_rest_for_agents() -> None:
    sched, engine, _ = make_scheduler(max_batch=4, class_lanes={QosClass.BACKGROUND: 2})
    for i in range(4):
        sched.add(make_job(max_tokens=6, qos=QosClass.BACKGROUND, job_id=f"bg{i}"))
    tick(sched, engine)
    assert lane_classes(sched) == [QosClass.BACKGROUND, QosClass.BACKGROUND, None, None]
    assert sched.queues.depth(QosClass.BACKGROUND) == 2

    sched.add(make_job(max_tokens=3, qos=QosClass.AGENT, job_id="agent0"))
    sched.add(make_job(max_tokens=3, qos=QosClass.AGENT, job_id="agent1"))
    events = tick(sched, engine)
    assert admitted_order(events) == ["agent0", "agent1"]
    assert lane_classes(sched).count(QosClass.BACKGROUND) == 2

    most_background = 2
    while sched.jobs:
        tick(sched, engine)
        most_background = max(most_background, lane_classes(sched).count(QosClass.BACKGROUND))
    assert most_background == 2


def test_a_capped_class_waits_while_a_later_job_of_another_class_takes_the_free_lane() -> None:
    sched, engine, _ = make_scheduler(max_batch=2, class_lanes={QosClass.AGENT: 1})
    sched.add(make_job(max_tokens=50, qos=QosClass.AGENT, job_id="agent-running"))
    sched.add(make_job(max_tokens=2, qos=QosClass.BACKGROUND, job_id="bg-short"))
    tick(sched, engine)
    sched.add(make_job(max_tokens=2, qos=QosClass.AGENT, job_id="agent-waiting"))
    sched.add(make_job(max_tokens=2, qos=QosClass.BACKGROUND, job_id="bg-later"))
    events: list[Event] = []
    for _ in range(3):  # bg-short finishes, its lane is released and taken
        events += tick(sched, engine)
    assert admitted_order(events) == ["bg-later"]
    assert sched.jobs["agent-waiting"].lane is None
    assert sched.queues.depth(QosClass.AGENT) == 1


def test_a_capped_class_is_admitted_again_once_one_of_its_lanes_frees() -> None:
    sched, engine, _ = make_scheduler(max_batch=2, class_lanes={QosClass.AGENT: 1})
    sched.add(make_job(max_tokens=2, qos=QosClass.AGENT, job_id="first"))
    sched.add(make_job(max_tokens=2, qos=QosClass.AGENT, job_id="second"))
    events = tick(sched, engine)
    assert admitted_order(events) == ["first"]
    assert lane_classes(sched) == [QosClass.AGENT, None]
    events = run_until_idle(sched, engine)
    assert admitted_order(events) == ["second"]


def starved_background_then_agent(
    wait_s: float, starvation_ticks: int = 4, tick_target_ms: int = 2000, join_s: float = 1.0
) -> list[str]:
    """One lane: a background job queues behind a running agent, a second agent job queues
    ``join_s`` later, and the lane frees (the runner is cancelled) after ``wait_s`` seconds.
    Returns the order in which the two waiting jobs are admitted."""
    sched, engine, clock = make_scheduler(max_batch=1, starvation_ticks=starvation_ticks, tick_target_ms=tick_target_ms)
    sched.add(make_job(max_tokens=10_000, job_id="runner"))
    sched.add(make_job(max_tokens=2, qos=QosClass.BACKGROUND, job_id="bg"))
    start = clock()
    events = []
    while clock() - start < join_s:
        events += tick(sched, engine)
    sched.add(make_job(max_tokens=2, qos=QosClass.AGENT, job_id="agent"))
    while clock() - start < wait_s:
        events += tick(sched, engine)
    sched.cancel("runner")
    events += run_until_idle(sched, engine)
    return admitted_order(events)[1:]


def test_a_background_job_that_has_not_waited_a_starvation_period_stays_behind_a_later_agent() -> None:
    # 4 ticks of --tick-target-ms 2000 = 8 s; the one-round ticks it waited (60 ms each) do not count
    assert starved_background_then_agent(wait_s=7.0) == ["agent", "bg"]


def test_a_background_job_that_waited_a_starvation_period_overtakes_a_later_agent() -> None:
    assert starved_background_then_agent(wait_s=8.5) == ["bg", "agent"]


def test_a_job_ages_out_of_its_class_even_behind_a_newer_one_of_higher_priority() -> None:
    """Every queued job rises a class per aging period, not only its queue's head: an old
    background job behind a newer background job of priority 100 overtakes a later agent once
    its wait lifts it above agent (it used to wait until priority aging made it the head)."""
    sched, engine, clock = make_scheduler(max_batch=1, starvation_ticks=8, tick_target_ms=2000)
    sched.add(make_job(max_tokens=10_000, job_id="busy"))
    tick(sched, engine)
    old = make_job(qos=QosClass.BACKGROUND, job_id="old")
    sched.add(old)
    clock.advance(40.0)  # two 16 s periods: background -> agent -> completion
    for job in (make_job(qos=QosClass.BACKGROUND, priority=100, job_id="new"), make_job(job_id="agent")):
        sched.add(job)
    now = clock()
    assert sched.queues.head(QosClass.BACKGROUND, now).job_id == "new"  # type: ignore[union-attr]
    assert sched.queues.best(set(QosClass), now).job_id == "old"  # type: ignore[union-attr]


def test_the_aging_period_is_starvation_ticks_busy_ticks_of_tick_target_ms() -> None:
    # 4 ticks of 250 ms: a 1 s period
    assert starved_background_then_agent(wait_s=0.9, tick_target_ms=250, join_s=0.3) == ["agent", "bg"]
    assert starved_background_then_agent(wait_s=1.2, tick_target_ms=250, join_s=0.3) == ["bg", "agent"]


def test_a_batch_request_waiting_4_s_still_starts_after_a_later_normal_request() -> None:
    """Request-priority seed: a batch job (-100, background) overtakes normal traffic only by
    aging over a long wait; with the defaults (8 ticks of 2 s) a 4 s wait changes nothing."""
    sched, engine, clock = make_scheduler(max_batch=1)
    sched.add(make_job(max_tokens=10_000, job_id="long-normal"))
    sched.add(make_job(max_tokens=2, qos=QosClass.BACKGROUND, priority=-100, job_id="batch"))
    events = tick(sched, engine)
    start = clock()
    while clock() - start < 3.9:
        events += tick(sched, engine)
    sched.add(make_job(max_tokens=2, qos=QosClass.AGENT, priority=0, job_id="normal"))
    while clock() - start < 4.0:
        events += tick(sched, engine)
    sched.cancel("long-normal")
    events += run_until_idle(sched, engine)
    assert admitted_order(events) == ["long-normal", "normal", "batch"]


def test_aging_lifts_a_background_job_one_class_per_period_waited() -> None:
    def first_admitted_when_lane_frees_after(wait_s: float) -> str:
        sched, engine, clock = make_scheduler(max_batch=1, starvation_ticks=3, tick_target_ms=1000, preemption=False)
        sched.add(make_job(max_tokens=10_000, job_id="runner"))
        sched.add(make_job(max_tokens=2, qos=QosClass.BACKGROUND, job_id="bg"))  # queued at 0 s
        start = clock()
        while clock() - start < wait_s - 0.2:
            tick(sched, engine)
        sched.add(make_job(max_tokens=2, qos=QosClass.COMPLETION, job_id="completion"))
        tick(sched, engine)
        sched.cancel("runner")
        plan = sched.step()
        return plan.bind[0].job_id

    assert first_admitted_when_lane_frees_after(4.5) == "completion"  # bg: one period, counts as agent
    assert first_admitted_when_lane_frees_after(6.5) == "bg"  # bg: two periods, counts as completion


def test_aging_never_lifts_a_job_above_interactive() -> None:
    sched, engine, clock = make_scheduler(max_batch=1, starvation_ticks=1, preemption=False, aging_divisor_s=0)
    sched.add(make_job(max_tokens=10_000, job_id="runner"))
    # every request at its class's anchor (what one that sends no priority gets), give or take
    sched.add(make_job(max_tokens=2, qos=QosClass.BACKGROUND, priority=-100, job_id="bg"))
    for _ in range(20):
        tick(sched, engine)
    clock.advance(60)
    sched.add(make_job(max_tokens=2, qos=QosClass.INTERACTIVE, priority=100 + 1, job_id="chat"))
    sched.add(make_job(max_tokens=2, qos=QosClass.INTERACTIVE, priority=100 - 5, job_id="chat-low"))
    bg = sched.jobs["bg"]
    assert sched.queues.effective_class(bg, clock()) == QosClass.INTERACTIVE
    sched.cancel("runner")
    events = run_until_idle(sched, engine)
    # bg counts as interactive at interactive's anchor, no better: chat's 100 + 1 beats it, it
    # beats chat-low's 100 - 5.
    assert admitted_order(events) == ["chat", "bg", "chat-low"]


def test_lane_caps_between_one_and_max_batch_are_accepted() -> None:
    config = SchedulerConfig(max_batch=4, class_lanes={QosClass.BACKGROUND: 1, QosClass.AGENT: 4})
    assert config.class_lanes == {QosClass.BACKGROUND: 1, QosClass.AGENT: 4}


@pytest.mark.parametrize("cap", [0, -1, 5])
def test_a_lane_cap_outside_one_to_max_batch_is_rejected(cap: int) -> None:
    with pytest.raises(ValueError, match="lane cap for background"):
        SchedulerConfig(max_batch=4, class_lanes={QosClass.BACKGROUND: cap})


@pytest.mark.parametrize("budget", [0, 64, 512, 4096])
def test_prefill_budget_zero_or_64_to_4096_is_accepted(budget: int) -> None:
    assert SchedulerConfig(prefill_budget=budget).prefill_budget == budget


@pytest.mark.parametrize("budget", [-1, 1, 63, 4097, 10_000])
def test_prefill_budget_outside_zero_or_64_to_4096_is_rejected(budget: int) -> None:
    with pytest.raises(ValueError, match="prefill_budget"):
        SchedulerConfig(prefill_budget=budget)


def test_max_batch_below_one_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        SchedulerConfig(max_batch=0)

