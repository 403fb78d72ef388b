"""Scored dispatch inside a class: priority + swap affinity + aging; what each request records."""

from __future__ import annotations

import pytest

from scheduler.core.qos import QosClass

from .builders import make_job, make_scheduler, run_until_idle, tick


def test_higher_priority_goes_first_and_equal_priority_keeps_arrival_order() -> None:
    sched, engine, clock = make_scheduler(max_batch=1)
    sched.add(make_job(job_id="busy", max_tokens=50))
    tick(sched, engine)
    for job_id, priority in [("a", 0), ("b", 5), ("c", 0), ("d", 5)]:
        sched.add(make_job(job_id=job_id, priority=priority, max_tokens=1))
        clock.advance(0.001)
    order = []
    for _ in range(200):
        for e in tick(sched, engine):
            if e.kind == "admitted":
                order.append(e.job_id)
        if not sched.jobs:
            break
    assert order == ["b", "d", "a", "c"]


@pytest.mark.parametrize(
    ("aging_divisor_s", "wait_s", "admitted", "reorders"),
    [
        # aging on: 101 minutes' wait, -100 + 101 > 0, so the old batch job overtakes
        (60.0, 101 * 60, ["old-batch", "new-normal"], 1),
        # aging off: priority alone decides, however long the wait
        (0, 10_000, ["new-normal", "old-batch"], 0),
    ],
    ids=["aging-lets-a-long-waiting-low-priority-job-overtake", "without-aging-priority-alone-decides"],
)
def test_aging_decides_whether_a_long_waiting_low_priority_job_overtakes(
    aging_divisor_s: float, wait_s: float, admitted: list[str], reorders: int
) -> None:
    sched, engine, clock = make_scheduler(max_batch=1, aging_divisor_s=aging_divisor_s, starvation_ticks=0)
    sched.add(make_job(job_id="busy", max_tokens=5))
    tick(sched, engine)
    sched.add(make_job(job_id="old-batch", priority=-100, max_tokens=1))
    clock.advance(wait_s)
    sched.add(make_job(job_id="new-normal", priority=0, max_tokens=1))
    assert [e.job_id for e in run_until_idle(sched, engine) if e.kind == "admitted"] == admitted
    assert sched.snapshot()["counters"]["reorders_aging"] == reorders


def test_a_preemption_that_aging_decided_counts_as_a_reorder() -> None:
    """Two chats queued behind a background lane: the older one, at a lower priority, has
    waited long enough for aging to put it first, and it is the one that preempts."""
    sched, engine, clock = make_scheduler(max_batch=1, aging_divisor_s=60.0)
    sched.add(make_job(job_id="bg", qos=QosClass.BACKGROUND, max_tokens=50))
    tick(sched, engine)
    sched.add(make_job(job_id="old-chat", qos=QosClass.INTERACTIVE, priority=-1, max_tokens=1))
    clock.advance(120)  # +2: it scores 1 against the new chat's 0
    sched.add(make_job(job_id="new-chat", qos=QosClass.INTERACTIVE, priority=0, max_tokens=1))
    plan = sched.step()
    assert [b.job_id for b in plan.bind] == ["old-chat"] and plan.park == [(0, "bg")]
    assert sched.snapshot()["counters"]["reorders_aging"] == 1


def test_the_dispatch_score_is_priority_plus_affinity_plus_aging_and_bands_are_counted() -> None:
    sched, engine, clock = make_scheduler(max_batch=1, aging_divisor_s=60.0, swap_affinity_bonus=10)
    sched.add(make_job(job_id="busy", max_tokens=3))
    tick(sched, engine)
    waiting = make_job(job_id="w", priority=-98, max_tokens=1, qos=QosClass.BACKGROUND)
    sched.add(waiting)
    clock.advance(120)  # two minutes: +2
    run_until_idle(sched, engine)
    assert waiting.serial_score is not None
    assert abs(waiting.serial_score - (-98 + 10 + 2)) < 0.05
    counters = sched.snapshot()["counters"]
    assert counters["dispatched_batch"] == 1 and counters["dispatched_normal"] == 1


def test_swap_affinity_is_validated_below_one_band() -> None:
    from scheduler.core.scheduler import SchedulerConfig

    with pytest.raises(ValueError):
        SchedulerConfig(swap_affinity_bonus=100)


def test_the_choices_of_one_request_are_one_dispatch_and_at_most_one_reorder() -> None:
    """A request of two choices (the second's ``request_of`` names the first) waited long enough
    for aging to put it before a newer, higher-priority one: one dispatch and one reorder for it,
    as the seed counts requests (llamaswap_scheduler_dispatched_total, _reorders_total), not two."""
    sched, engine, clock = make_scheduler(max_batch=1, aging_divisor_s=60.0, starvation_ticks=0)
    sched.add(make_job(job_id="busy", max_tokens=5))
    tick(sched, engine)
    sched.add(make_job(job_id="old", priority=-100, max_tokens=1))
    follower = make_job(job_id="old-2", priority=-100, max_tokens=1)
    follower.request_of = "old"
    sched.add(follower)
    clock.advance(101 * 60)
    sched.add(make_job(job_id="new", priority=0, max_tokens=1))
    assert [e.job_id for e in run_until_idle(sched, engine) if e.kind == "admitted"] == ["old", "old-2", "new"]
    counters = sched.snapshot()["counters"]
    assert (counters["dispatched_batch"], counters["dispatched_normal"]) == (1, 2)  # old's request; busy and new
    assert counters["reorders_aging"] == 1
