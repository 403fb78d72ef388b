"""What a reply reports after a preemption without a park, pin age, and an OS
pressure source that stops answering."""

from __future__ import annotations

from typing import Any

from scheduler.core.kv_pool import KvPool, PoolConfig, PoolOps
from scheduler.core.qos import QosClass
from scheduler.core.scheduler import OS_PRESSURE_BACKGROUND_HOLD_S
from scheduler.worker.pressure import PressureMonitor

from .builders import make_job, make_scheduler, run_until_idle, tick


def _seeded_and_decoding(park: bool = True) -> tuple[Any, Any, Any]:
    """One lane; a job seeded from a 64-token pinned prefix, three tokens into its reply:
    (scheduler, engine, job)."""
    sched, engine, _clock = make_scheduler(max_batch=1, lane_ctx=512, cache_slots=2, keep_lanes=False, park=park)
    warm = make_job(64, job_id="warm", max_tokens=2)
    warm.pin_prefix = True
    sched.add(warm)
    run_until_idle(sched, engine)
    job = make_job(8, job_id="agent", max_tokens=12)
    job.prompt = list(warm.prompt) + job.prompt
    sched.add(job)
    while len(job.output) < 3:
        tick(sched, engine)
    return sched, engine, job


def _cached_then_preempted(park: bool) -> int:
    """A job seeded from a cached prefix is preempted after its first tokens by a chat on the
    only lane; the cached_tokens its finished event reports."""
    sched, engine, job = _seeded_and_decoding(park)
    assert job.cached_tokens == 64  # seeded from the pinned prefix
    sched.add(make_job(8, job_id="chat", max_tokens=2, qos=QosClass.INTERACTIVE))
    events = run_until_idle(sched, engine)
    assert job.preemptions == 1
    (done,) = [e for e in events if e.kind == "finished" and e.job_id == "agent"]
    assert done.job is not None
    return done.job.cached_tokens


def test_a_job_preempted_without_a_park_reports_no_cached_tokens_after_recomputing_its_prompt() -> None:
    """Without a park the job recomputes its whole prompt and output: none of its prompt came
    from the cache in the end, so usage.prompt_tokens_details.cached_tokens must not still say
    64 (what it reused at its first admission)."""
    assert _cached_then_preempted(park=False) == 0


def test_a_parked_job_keeps_the_cached_tokens_of_its_first_admission() -> None:
    assert _cached_then_preempted(park=True) == 64


def test_a_failed_park_recomputes_and_reports_no_cached_tokens() -> None:
    """A park the engine did not deliver recomputes the job from the start, like --no-park."""
    sched, engine, job = _seeded_and_decoding()
    sched.add(make_job(8, job_id="chat", max_tokens=2, qos=QosClass.INTERACTIVE))
    plan = sched.step()
    assert plan.park == [(0, "agent")]
    result = engine.execute(plan, lambda: False)
    result.parked.clear()  # the park failed: no artifact
    events = sched.commit(result)
    events += run_until_idle(sched, engine)
    (done,) = [e for e in events if e.kind == "finished" and e.job_id == "agent"]
    assert done.job is not None and done.job.cached_tokens == 0


def test_a_pin_on_an_entry_cached_unpinned_counts_its_age_from_the_pin() -> None:
    """Pinned prefixes yield oldest first: a pin made just now on a prefix cached unpinned long
    ago must not be evicted before an older pin."""
    pool = KvPool(PoolConfig(n_lanes=2, lane_ctx=256, cache_slots=2))
    old_shared = [5] * 40
    old_pin = [6] * 40
    new_pin = [7] * 40
    ops = PoolOps()
    assert pool.store(ops, 0, old_shared, 0.0) is not None  # cached unpinned at t=0
    assert pool.store(ops, 1, old_pin, 5.0, pinned=True) is not None  # pinned at t=5
    pool.settle({})
    repinned = pool.store(PoolOps(), 0, old_shared, 10.0, pinned=True)  # pinned at t=10
    assert repinned is not None and repinned.pinned
    ops = PoolOps()
    assert pool.store(ops, 1, new_pin, 20.0, pinned=True) is not None  # needs a slot: one pin goes
    pool.settle({})
    kept = {tuple(e.tokens) for e in pool.device_entries()}
    assert tuple(old_shared) in kept, "the pin made at t=10 was evicted before the one made at t=5"
    assert tuple(old_pin) not in kept


def test_an_unreadable_pressure_source_after_critical_reads_as_normal() -> None:
    """The source reported critical, then cannot be read (PSI file gone, sysctl failing). The
    monitor must not leave the worker at critical for good: background would never be admitted
    again. An unreadable source is treated as no source: normal."""
    readings: list[object] = ["critical", OSError("gone")]

    def read() -> str | None:
        value = readings.pop(0) if readings else OSError("gone")
        if isinstance(value, Exception):
            raise value
        return value  # type: ignore[return-value]

    monitor = PressureMonitor(read=read)
    sched, engine, clock = make_scheduler(max_batch=2)
    level = monitor.poll(0.0)
    assert level == "critical"
    sched.on_os_pressure(level)
    tick(sched, engine)  # the worker ticks between readings: critical is acted on
    for t in range(1, 10):
        level = monitor.poll(float(t))
        if level is not None:
            sched.on_os_pressure(level)
        tick(sched, engine)
    assert sched.os_level is None
    clock.advance(OS_PRESSURE_BACKGROUND_HOLD_S + 1)
    job = make_job(8, job_id="bg", qos=QosClass.BACKGROUND, max_tokens=2)
    sched.add(job)
    tick(sched, engine)
    assert job.lane is not None


def test_an_unreadable_pressure_source_from_the_start_stays_silent() -> None:
    def broken() -> str | None:
        raise OSError("no PSI here")

    monitor = PressureMonitor(read=broken)
    assert [monitor.poll(float(t)) for t in range(3)] == [None, None, None]
