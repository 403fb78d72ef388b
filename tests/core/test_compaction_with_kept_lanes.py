"""Lane compaction beside kept lanes, preemption and a decode budget, as a property.

docs/scheduling.md (Lane compaction): a move copies a job's KV into a free lane inside the
window and a kept KV there trades places with it and still serves its conversation; nothing
streams other tokens than it would in place. Here conversations of every class come and go
(cancels, preemption by chats, a lane kept for a prefix and then needed by another job) with
compaction on and a small --compact-min-tokens so moves happen often.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.qos import QosClass
from scheduler.core.types import Job
from scheduler.engines.sim import SimEngine
from tests.core.builders import make_job, make_scheduler, tick
from tests.core.test_kept_lanes import assert_kv_matches

turns = st.lists(
    st.tuples(
        st.integers(0, 4),  # which conversation
        st.integers(1, 50),  # new tokens this turn
        st.integers(1, 40),  # max_tokens
        st.sampled_from(list(QosClass)),
        st.integers(0, 4),  # ticks before the next request arrives
        st.booleans(),  # cancel the turn after those ticks
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=turns, max_batch=st.integers(2, 5), decode_budget=st.sampled_from([0, 1, 2]))
def test_with_compaction_every_lane_holds_its_jobs_tokens_and_every_reply_is_unchanged(
    turns: list[tuple[int, int, int, QosClass, int, bool]], max_batch: int, decode_budget: int
) -> None:
    sched, engine, _ = make_scheduler(
        max_batch=max_batch,
        compact_lanes=True,
        compact_min_tokens=1,
        min_prefix_tokens=8,
        prefill_budget=64,
        tick_decode_budget=decode_budget,
    )
    last: dict[int, Job] = {}
    jobs: list[Job] = []

    def one_tick() -> None:
        tick(sched, engine)
        assert_kv_matches(sched, engine)
        for lane, job in enumerate(sched.lanes):
            assert job is None or job.lane == lane
            assert job is None or lane not in sched._kept  # a kept KV never sits under a job

    for i, (conv, new, max_tokens, qos, wait, cancel) in enumerate(turns):
        job = make_job(new, job_id=f"c{conv}t{i}", max_tokens=max_tokens, qos=qos)
        if conv in last:
            job.prompt = last[conv].prompt + last[conv].output + job.prompt
        last[conv] = job
        jobs.append(job)
        sched.add(job)
        for _ in range(wait):
            one_tick()
        if cancel:
            sched.cancel(job.job_id)
    for _ in range(10_000):
        if not sched.jobs:
            break
        one_tick()
    assert not sched.jobs
    for job in jobs:
        expected = [SimEngine.next_token(job.prompt + job.output[:k]) for k in range(len(job.output))]
        assert job.output == expected, job.job_id
    assert sched.pool.counters["prefix_tokens_reused"] == sum(j.cached_tokens for j in jobs)
