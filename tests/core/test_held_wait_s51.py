"""Why a request waited: of its queue wait, the time a lane was free that its class could not
take (``Job.held_s``: its class-lane cap reached, or background held under critical memory
pressure), apart from the time it waited for a lane. The activity log's ``held_wait_ms``
(docs/operations.md): before, a background request that waited seconds beside idle lanes under
a cap of one looked like one that waited for a busy machine."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.qos import QosClass

from .builders import make_job, make_scheduler, run_until_idle, tick


def test_a_job_its_class_cap_holds_beside_a_free_lane_counts_that_time_as_held() -> None:
    sched, engine, clock = make_scheduler(max_batch=3, class_lanes={QosClass.BACKGROUND: 1}, decode_round_s=0.05)
    first, second = make_job(max_tokens=20, qos=QosClass.BACKGROUND, job_id="first"), make_job(max_tokens=4, qos=QosClass.BACKGROUND, job_id="second")
    sched.add(first)
    sched.add(second)
    while first.finish_reason is None:
        tick(sched, engine)
    assert second.admitted_s is None  # two lanes stayed free all along
    run_until_idle(sched, engine)
    assert second.admitted_s is not None
    assert second.held_s > 0.5 and abs(second.held_s - (second.admitted_s - second.enqueued_s)) < 1e-9
    assert first.held_s == 0.0


def test_a_job_waiting_for_a_busy_machine_is_never_held() -> None:
    sched, engine, _ = make_scheduler(max_batch=1, decode_round_s=0.05)
    jobs = [make_job(max_tokens=10, job_id=f"a{i}") for i in range(3)]
    for job in jobs:
        sched.add(job)
    run_until_idle(sched, engine)
    assert jobs[2].admitted_s is not None and jobs[2].admitted_s - jobs[2].enqueued_s > 0.5
    assert [j.held_s for j in jobs] == [0.0, 0.0, 0.0]


def test_background_held_under_critical_memory_pressure_counts_as_held() -> None:
    sched, engine, clock = make_scheduler(max_batch=2, decode_round_s=0.05)
    sched.on_os_pressure("critical")
    bg = make_job(max_tokens=4, qos=QosClass.BACKGROUND, job_id="bg")
    sched.add(bg)
    for _ in range(5):
        tick(sched, engine)
        clock.advance(0.1)
    assert bg.admitted_s is None and bg.held_s > 0.4
    sched.on_os_pressure(None)
    clock.advance(10.0)  # (background waits a while after the pressure ends)
    run_until_idle(sched, engine)
    assert bg.admitted_s is not None


@settings(max_examples=60, deadline=None)
@given(
    classes=st.lists(st.sampled_from([QosClass.INTERACTIVE, QosClass.AGENT, QosClass.BACKGROUND]), min_size=1, max_size=8),
    cap=st.integers(1, 3),
    lanes=st.integers(1, 4),
    tokens=st.lists(st.integers(1, 12), min_size=8, max_size=8),
)
def test_held_time_is_never_more_than_the_queue_wait(classes: list[QosClass], cap: int, lanes: int, tokens: list[int]) -> None:
    sched, engine, _ = make_scheduler(max_batch=lanes, class_lanes={QosClass.BACKGROUND: min(cap, lanes)}, decode_round_s=0.02)
    jobs = [make_job(max_tokens=tokens[i], qos=q, job_id=f"j{i}") for i, q in enumerate(classes)]
    for job in jobs:
        sched.add(job)
    run_until_idle(sched, engine)
    for job in jobs:
        assert job.admitted_s is not None
        assert 0.0 <= job.held_s <= job.admitted_s - job.arrival_s + 1e-9 or job.preemptions, job
        if job.qos is not QosClass.BACKGROUND:
            assert job.held_s == 0.0  # only background has a cap here
