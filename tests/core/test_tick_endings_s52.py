"""Tick sizing on an engine that declares the seed's tick targets (llama.cpp, MLX: 50 / 250 ms):
the rules docs/scheduling.md ("Ticks") states that no test held. Each test here passed with its
rule removed from Scheduler._tick_continues or Scheduler.commit before it was written."""

from __future__ import annotations

from scheduler.core.qos import QosClass

from .builders import make_job, make_scheduler, tick


def test_a_tick_runs_rounds_at_the_measured_round_time_not_the_first_guess() -> None:
    """Rounds of 20 ms against a first guess of 200 ms: once measured, a busy 250 ms tick is about
    twelve rounds, not the one or two the guess allows."""
    sched, engine, _ = make_scheduler(
        max_batch=2, tick_targets_s=(0.05, 0.25), decode_round_s=0.02, initial_round_s=0.2
    )
    for i in range(2):
        sched.add(make_job(job_id=f"s{i}", max_tokens=1000))
    for _ in range(40):  # the prompts, then rounds enough to measure one
        tick(sched, engine)
    start = sched.tick
    for _ in range(120):
        tick(sched, engine)
    assert 8 <= sched.tick - start <= 12  # 120 rounds of 20 ms in ~250 ms ticks


def test_a_batch_invariant_lane_running_makes_every_round_a_tick_of_its_own() -> None:
    """It ticks alone, one round at a time: ticks do not run on for rounds beside it."""
    sched, engine, _ = make_scheduler(max_batch=2, tick_targets_s=(0.05, 0.25), decode_round_s=0.02)
    sched.add(make_job(job_id="inv", batch_invariant=True, max_tokens=1000))
    sched.add(make_job(job_id="agent", max_tokens=1000))
    for _ in range(4):
        tick(sched, engine)
    start = sched.tick
    for _ in range(30):
        tick(sched, engine)
    assert sched.tick - start == 30


def test_a_prefilling_lane_makes_every_round_a_tick_of_its_own() -> None:
    """Its prefill is sized to the tick's cap (the prefill budget and step size), so a tick that
    prefills is one round: more rounds would carry more prompt than the cap, and admission waits
    for the tick's end. Here short 64-token steps take ~6 ms, well inside a 250 ms tick."""
    sched, engine, _ = make_scheduler(
        max_batch=2, tick_targets_s=(0.05, 0.25), decode_round_s=0.02, prefill_budget=64, prefill_s_per_token=0.0001
    )
    sched.add(make_job(job_id="talker", max_tokens=1000))
    for _ in range(20):  # its prompt, then decode rounds that measure a round at 20 ms
        tick(sched, engine)
    sched.add(make_job(3000, job_id="long", qos=QosClass.BACKGROUND, max_tokens=1000))
    start = sched.tick
    for _ in range(20):
        tick(sched, engine)
        assert sched.jobs["long"].prefilling
    assert sched.tick - start == 20
