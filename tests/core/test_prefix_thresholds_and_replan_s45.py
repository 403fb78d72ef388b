"""Two prefix-cache rules of docs/scheduling.md#kv-pool-and-prefix-cache that no test could
fail: the 32-token floor for sharing a cached or running lane's prefix, and the replan's
release of every pin."""

from __future__ import annotations

from scheduler.core.types import Job

from .builders import make_job, make_scheduler, run_until_idle, tick


def sharing(base: Job, n: int, job_id: str, extra: int = 20) -> Job:
    """A job whose prompt starts with ``n`` tokens of ``base``'s, then its own."""
    job = make_job(extra, job_id=job_id, max_tokens=2)
    job.prompt = base.prompt[:n] + [250 - (i % 7) for i in range(extra)]
    assert job.prompt[n] != base.prompt[n]
    return job


def test_a_cached_prefix_seeds_a_lane_from_32_shared_tokens_not_31() -> None:
    sched, engine, _ = make_scheduler(max_batch=2, keep_lanes=False)
    base = make_job(200, job_id="base", max_tokens=2)
    base.pin_prefix = True  # cached once prefilled
    sched.add(base)
    run_until_idle(sched, engine)
    assert [e.tokens for e in sched.pool.device_entries()] == [base.prompt]
    short, enough = sharing(base, 31, "short"), sharing(base, 32, "enough")
    sched.add(short)
    run_until_idle(sched, engine)
    sched.add(enough)
    run_until_idle(sched, engine)
    assert (short.cached_tokens, enough.cached_tokens) == (0, 32)


def test_a_new_lane_waits_for_a_running_lanes_prefix_from_32_shared_tokens_not_31() -> None:
    """Admitted in the tick its leader is (nothing of the leader's prompt computed yet): a job
    sharing 32 tokens of the leader's prompt waits for them and copies them; one sharing 31
    prefills its own prompt from the start."""
    sched, engine, _ = make_scheduler(max_batch=3, prefill_budget=64, keep_lanes=False)
    leader = make_job(400, job_id="leader", max_tokens=2)
    short, enough = sharing(leader, 31, "short"), sharing(leader, 32, "enough")
    for job in (leader, short, enough):
        sched.add(job)
    tick(sched, engine)
    assert (short.share_from, enough.share_from) == (None, "leader")
    run_until_idle(sched, engine)
    assert (short.cached_tokens, enough.cached_tokens) == (0, 32)


def test_a_refused_plan_releases_every_pin_and_drops_the_device_cache() -> None:
    """One cache slot: pinned prompt A is stored, then pinned prompt B displaces it (the oldest
    pin) to host memory. The engine refuses a plan: the replan drops B from the device and
    releases every pin, A's in host memory too, so a pin does not outlive the replan that was
    to release it (A imported back would otherwise displace a newer pin again)."""
    sched, engine, _ = make_scheduler(max_batch=1, cache_slots=1, keep_lanes=False)
    a, b = make_job(100, job_id="a", max_tokens=2), make_job(100, job_id="b", max_tokens=2)
    for job in (a, b):
        job.pin_prefix = True
        sched.add(job)
        run_until_idle(sched, engine)
    (device,) = sched.pool.device_entries()
    (host,) = sched.pool.host_entries()
    assert (device.tokens, device.pinned, host.tokens, host.pinned) == (b.prompt, True, a.prompt, True)
    slot = device.slot
    assert slot is not None and engine.kv[slot] == b.prompt
    sched.on_plan_rejected()
    tick(sched, engine)
    assert sched.pool.device_entries() == [] and engine.kv[slot] == []
    assert [(e.tokens, e.pinned) for e in sched.pool.entries.values()] == [(a.prompt, False)]
