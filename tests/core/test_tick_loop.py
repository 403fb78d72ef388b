"""The tick loop: admission into lanes, prefill and decode in one tick, finishing, cancelling."""

from __future__ import annotations

from scheduler.engines.sim import SimEngine

from .builders import finished, make_job, make_jobs, make_scheduler, outputs, run_until_idle, tick


def test_jobs_fill_free_lanes_and_the_rest_wait_in_the_queue() -> None:
    sched, engine, _ = make_scheduler(max_batch=4)
    for job in make_jobs(6):
        sched.add(job)
    tick(sched, engine)
    snap = sched.snapshot()
    assert snap["lanes_active"] == 4
    assert snap["queue_depth"]["agent"] == 2


def test_prefill_chunks_and_decode_tokens_of_many_lanes_share_one_engine_call() -> None:
    sched, engine, _ = make_scheduler(max_batch=4)
    first = make_job(8, max_tokens=20)
    sched.add(first)
    tick(sched, engine)  # first prefills and samples its first token
    sched.add(make_job(8))
    engine.calls.clear()
    tick(sched, engine)
    (call,) = engine.calls
    assert sorted(n for _, n in call) == [1, 8]  # one decode token beside a whole prompt chunk


def test_every_job_gets_exactly_max_tokens_then_finishes_with_length() -> None:
    sched, engine, _ = make_scheduler(max_batch=3)
    jobs = make_jobs(5, max_tokens=7)
    for job in jobs:
        sched.add(job)
    events = run_until_idle(sched, engine)
    assert {j: len(t) for j, t in outputs(events).items()} == {j.job_id: 7 for j in jobs}
    assert set(finished(events).values()) == {"length"}


def test_end_of_generation_finishes_with_stop_and_its_token_is_not_emitted() -> None:
    job = make_job(max_tokens=50, job_id="eog-job")
    sched, engine, _ = make_scheduler(eog_after={"eog-job": 4})
    sched.add(job)
    events = run_until_idle(sched, engine)
    assert len(outputs(events)["eog-job"]) == 3
    assert finished(events) == {"eog-job": "stop"}


def test_a_full_lane_context_finishes_with_length() -> None:
    sched, engine, _ = make_scheduler(lane_ctx=32)
    sched.add(make_job(30, max_tokens=100, job_id="long"))
    events = run_until_idle(sched, engine)
    assert len(outputs(events)["long"]) == 2
    assert finished(events) == {"long": "length"}


def test_cancelling_a_running_job_frees_its_lane_for_the_next_in_queue() -> None:
    sched, engine, _ = make_scheduler(max_batch=1)
    running, waiting = make_job(max_tokens=100), make_job(max_tokens=3)
    sched.add(running)
    sched.add(waiting)
    tick(sched, engine)
    assert sched.cancel(running.job_id)
    plan = sched.step()
    assert 0 in plan.release + plan.keep  # freed; its KV kept until a job takes the lane
    assert [b.job_id for b in plan.bind] == [waiting.job_id]
    assert plan.trim == [(0, 0)]  # the waiting job shares nothing: the lane is emptied for it
    assert engine.execute(plan, lambda: False).fed[0] > 0  # the engine reused the freed lane
    assert engine.kv[0] == waiting.prompt


def test_cancelling_a_queued_job_removes_it_without_touching_any_lane() -> None:
    sched, engine, _ = make_scheduler(max_batch=1)
    running, waiting = make_job(max_tokens=100), make_job()
    sched.add(running)
    sched.add(waiting)
    tick(sched, engine)
    sched.cancel(waiting.job_id)
    plan = sched.step()
    assert not plan.release and not plan.bind
    assert sched.snapshot()["queue_depth"]["agent"] == 0


def test_engine_stopping_early_leaves_unfed_prompt_for_the_next_tick() -> None:
    sched, engine, _ = make_scheduler(max_batch=1, initial_prefill_tokens_per_s=128.0)
    job = make_job(200, max_tokens=2)
    sched.add(job)
    plan = sched.step()
    assert plan.step_tokens == 64  # 128 tok/s * 0.5 s fits a 64-token step
    result = engine.execute(plan, should_stop=lambda: True)
    assert result.stopped_early and result.fed == {0: 64}
    sched.commit(result)
    assert job.computed == 64
    events = run_until_idle(sched, engine)
    assert len(outputs(events)[job.job_id]) == 2


def test_same_prompts_give_same_tokens_however_they_are_batched() -> None:
    alone, eng_a, _ = make_scheduler(max_batch=1)
    batched, eng_b, _ = make_scheduler(max_batch=8)
    jobs_a = make_jobs(4, prompt_tokens=40, max_tokens=12)
    jobs_b = [make_job(40, max_tokens=12, job_id=j.job_id + "b") for j in jobs_a]
    for a, b in zip(jobs_a, jobs_b, strict=True):
        b.prompt = list(a.prompt)
        alone.add(a)
        batched.add(b)
    out_a = outputs(run_until_idle(alone, eng_a))
    out_b = outputs(run_until_idle(batched, eng_b))
    assert [out_a[j.job_id] for j in jobs_a] == [out_b[j.job_id] for j in jobs_b]
    assert SimEngine.next_token([1, 2, 3]) == SimEngine.next_token([1, 2, 3])
