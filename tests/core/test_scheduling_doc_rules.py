"""Rules of docs/scheduling.md that a user notices (who runs first, who waits) and that no other
test pinned: class aging against the request priority's 100 minutes inside one worker, an aged
job's own class cap, and the first urgent job holding back the later ones' preemptions."""

from __future__ import annotations

import pytest

from scheduler.core.qos import QosClass
from scheduler.core.types import Event, JobState

from .builders import make_job, make_scheduler, run_until_idle, tick
from .test_seed_rules import aged_background_admitted_ahead_of_a_completion


def admitted_order(events: list[Event]) -> list[str]:
    return [e.job_id for e in events if e.kind == "admitted"]


@pytest.mark.parametrize(
    ("batch_class", "later_s", "first"),
    [
        # the same class: one 16 s period of difference lifts the -100 job above the later one
        (QosClass.AGENT, 10.0, "normal"),
        (QosClass.AGENT, 20.0, "batch"),
        # the batch band's own class (background, whose anchor -100 is) against agent: one period
        # lifts it into agent, where it counts from agent's anchor, 0, and is the older (it took
        # two periods while it counted -100 there)
        (QosClass.BACKGROUND, 10.0, "normal"),
        (QosClass.BACKGROUND, 20.0, "batch"),
    ],
)
def test_inside_one_worker_class_aging_puts_a_minus_100_job_before_normal_jobs_a_period_younger(
    batch_class: QosClass, later_s: float, first: str
) -> None:
    """docs/scheduling.md, Queues and request priority: the score alone would keep a -100 job
    behind normal traffic for ~100 minutes, but inside one worker class aging (--starvation-ticks
    busy ticks of --tick-target-ms: 16 s) lifts it a class per period, so it goes before a normal
    job that reached the worker a period after it: in its own class by a class of aging, as
    background by rising into agent."""
    sched, engine, clock = make_scheduler(max_batch=1)  # the defaults: 8 ticks of 2 s
    sched.add(make_job(max_tokens=10_000, job_id="long-normal"))
    sched.add(make_job(max_tokens=2, qos=batch_class, priority=-100, job_id="batch"))
    events = tick(sched, engine)
    start = clock()
    while clock() - start < later_s:
        events += tick(sched, engine)
    sched.add(make_job(max_tokens=2, qos=QosClass.AGENT, priority=0, job_id="normal"))
    events += tick(sched, engine)
    sched.cancel("long-normal")
    events += run_until_idle(sched, engine)
    second = "batch" if first == "normal" else "normal"
    assert admitted_order(events) == ["long-normal", first, second]


def test_an_aged_job_still_keeps_to_its_own_class_lane_cap() -> None:
    """docs/scheduling.md: class aging lifts a job's standing, "class caps still apply to its own
    class": a background job aged to count as completion does not take a free lane while
    background holds its cap; the later agent does."""
    sched, engine, clock = make_scheduler(max_batch=2, class_lanes={QosClass.BACKGROUND: 1})
    sched.add(make_job(job_id="bg-running", qos=QosClass.BACKGROUND, max_tokens=10_000))
    sched.add(make_job(job_id="agent-running", max_tokens=10_000))
    tick(sched, engine)
    sched.add(make_job(job_id="bg-old", qos=QosClass.BACKGROUND, max_tokens=2))
    clock.advance(40.0)  # two and a half 16 s periods: it counts as completion
    sched.add(make_job(job_id="agent-new", max_tokens=2))
    assert sched.queues.effective_class(sched.jobs["bg-old"], clock()) == QosClass.COMPLETION
    sched.cancel("agent-running")
    plan = sched.step()
    assert [b.job_id for b in plan.bind] == ["agent-new"]
    sched.commit(engine.execute(plan, lambda: False))
    while "agent-new" in sched.jobs:
        tick(sched, engine)
        assert sched.jobs["bg-old"].lane is None  # background is still at its cap
    sched.cancel("bg-running")
    plan = sched.step()
    assert [b.job_id for b in plan.bind] == ["bg-old"]


def test_when_the_first_urgent_job_may_take_no_lane_no_later_one_preempts_before_it() -> None:
    """docs/scheduling.md, Preemption: "when the first urgent job in that order finds no lane it
    may take, no later one preempts before it". The completion job aging put behind the
    background job may not take its lane back yet; a later completion job of lower priority,
    which aging did not beat, would (control), but waits behind the first."""
    sched, engine, _ = aged_background_admitted_ahead_of_a_completion(10_000)
    sched.add(make_job(job_id="fim-later", qos=QosClass.COMPLETION, priority=-10, max_tokens=4))
    plan = sched.step()
    assert plan.bind == [] and plan.park == []
    assert sched.jobs["bg"].lane == 0
    sched.commit(engine.execute(plan, lambda: False))

    control, control_engine, _ = aged_background_admitted_ahead_of_a_completion(10_000)
    control.cancel("fim")
    control.add(make_job(job_id="fim-later", qos=QosClass.COMPLETION, priority=-10, max_tokens=4))
    plan = control.step()
    assert [b.job_id for b in plan.bind] == ["fim-later"] and plan.park == [(0, "bg")]


def test_a_preempted_job_heads_its_class_but_a_job_of_its_class_aging_lifted_higher_goes_first() -> None:
    """docs/scheduling.md: a preempted job goes back to the head of its class, ahead of every
    score; a job of its class that has waited long enough for class aging to count it a class
    better (20 s, one 16 s period) still goes before it. The preempted job has waited nothing
    (admitted at once), so it counts as background."""
    sched, engine, clock = make_scheduler(max_batch=1)
    sched.add(make_job(job_id="preempted", qos=QosClass.BACKGROUND, max_tokens=10_000))
    tick(sched, engine)
    sched.add(make_job(job_id="aged", qos=QosClass.BACKGROUND, max_tokens=2))
    sched.add(make_job(job_id="fresh", qos=QosClass.BACKGROUND, priority=100, max_tokens=2))
    clock.advance(20.0)
    sched.add(make_job(job_id="chat", qos=QosClass.INTERACTIVE, max_tokens=2))
    sched.add(make_job(job_id="later", qos=QosClass.BACKGROUND, priority=100, max_tokens=2))
    events = tick(sched, engine)
    assert [(e.kind, e.job_id) for e in events if e.kind in ("preempted", "admitted")] == [("preempted", "preempted"), ("admitted", "chat")]
    events = run_until_idle(sched, engine)
    order = [e.job_id for e in events if e.kind in ("admitted", "resumed")]
    # "aged" and "fresh" waited 20 s (they count as agent): "fresh" first by its priority; then
    # the preempted job, at the head of background, before "later" and its priority of 100
    assert order == ["fresh", "aged", "preempted", "later"]



def test_a_batch_invariant_lane_neither_takes_nor_gives_prefix_cache_copies() -> None:
    """docs/scheduling.md, Batch-invariant lanes: "Batch-invariant lanes never take or give
    prefix-cache copies": a batch-invariant job sharing a cached prefix, or a running lane's
    prompt, prefills its whole prompt itself; a job sharing a running batch-invariant lane's
    prompt neither waits for nor copies it."""
    sched, engine, _ = make_scheduler(max_batch=2)
    pinned = make_job(200, job_id="pinned", max_tokens=2)
    pinned.pin_prefix = True
    sched.add(pinned)
    run_until_idle(sched, engine)
    takes = make_job(1, job_id="bi-takes", max_tokens=2, batch_invariant=True)
    takes.prompt = pinned.prompt + [7, 8]
    assert sched.pool.best_match(takes.prompt)[1] == 200  # its first 200 tokens are cached
    leader = make_job(1, job_id="leader", max_tokens=50)
    leader.prompt = [9] * 300 + [5]
    sched.add(leader)
    tick(sched, engine)
    follower = make_job(1, job_id="bi-follows", max_tokens=2, batch_invariant=True)
    follower.prompt = [9] * 300 + [6]  # shares the running leader's first 300 tokens
    for job in (takes, follower):
        sched.add(job)
    while takes.state is JobState.QUEUED or follower.state is JobState.QUEUED:
        plan = sched.step()
        assert not plan.pool.copy and all(n == 0 for _lane, n in plan.trim)
        sched.commit(engine.execute(plan, lambda: False))
        assert takes.share_from is None and follower.share_from is None
    run_until_idle(sched, engine)
    assert takes.cached_tokens == 0 and follower.cached_tokens == 0

    # gives: a job sharing a running batch-invariant lane's prompt prefills it itself
    sched, engine, _ = make_scheduler(max_batch=2)
    bi = make_job(1, job_id="bi", max_tokens=50, batch_invariant=True)
    bi.prompt = [9] * 300 + [5]
    sched.add(bi)
    tick(sched, engine)
    other = make_job(1, job_id="other", max_tokens=2)
    other.prompt = [9] * 300 + [6]
    sched.add(other)
    while other.state is not JobState.FINISHED:
        plan = sched.step()
        assert not plan.pool.copy and not plan.pool.store
        sched.commit(engine.execute(plan, lambda: False))
        assert other.share_from is None
    assert other.cached_tokens == 0


@pytest.mark.parametrize("abortable", [False, True])
@pytest.mark.parametrize(("tick_target_ms", "prompt_tokens"), [(2000, 4 * 512 - 1), (100, 512 - 1)])
def test_a_prefill_tick_beside_a_decoding_lane_is_never_longer_than_tick_target_ms(
    abortable: bool, tick_target_ms: int, prompt_tokens: int
) -> None:
    """docs/scheduling.md, Prefill budget and step size: while a lane decodes, a tick carries the
    decode round and whole prompt steps up to the busy-tick target, 0.25 s, or --tick-target-ms
    where that is lower, as decode rounds are ("neither above --tick-target-ms"). At 9000 tok/s
    such a tick carried four 512-token steps (0.25 s) under --tick-target-ms 100 too, where one
    fits: the decoding stream waited 2.5 times the tick the operator asked for."""
    rate = 9000.0  # a 512-token step fits 0.5 s; four fit 0.25 s, one 0.1 s
    sched, engine, _ = make_scheduler(
        max_batch=2,
        tick_target_ms=tick_target_ms,
        abortable_steps=abortable,
        initial_prefill_tokens_per_s=rate,
        prefill_s_per_token=1.0 / rate,
        decode_round_s=0.0,
    )
    sched.add(make_job(8, max_tokens=10_000, job_id="talker"))
    tick(sched, engine)  # its prompt: it decodes from now on
    sched.add(make_job(3000, job_id="long"))
    plan = sched.step()
    assert plan.step_tokens == 512
    assert [f.job_id for f in plan.feeds if f.is_decode] == ["talker"]
    assert plan.prefill_tokens == prompt_tokens  # whole steps with the decode token in the first


def test_serial_score_is_the_seeds_score_without_the_lift_class_aging_gave() -> None:
    """docs/scheduling.md: a finished request's serial_score is the seed's score (priority + swap
    affinity + aging) when it won its lane. A background request at -100 that class aging lifted
    into agent wins its lane there as if it were at agent's anchor, 0, but its serial_score is
    its own -100 + 10 + aging, not ~+10."""
    sched, engine, clock = make_scheduler(max_batch=1)  # the defaults: a 16 s aging period
    sched.add(make_job(max_tokens=10_000, job_id="long"))
    tick(sched, engine)
    sched.add(make_job(max_tokens=2, qos=QosClass.BACKGROUND, priority=-100, job_id="bg"))
    clock.advance(20.0)
    sched.add(make_job(max_tokens=2, qos=QosClass.AGENT, priority=0, job_id="agent"))
    bg = sched.jobs["bg"]
    assert sched.queues.effective_class(bg, clock()) == QosClass.AGENT
    sched.cancel("long")
    plan = sched.step()
    assert [b.job_id for b in plan.bind] == ["bg"]  # lifted, and older than the agent job
    assert bg.serial_score == pytest.approx(-100 + 10 + (clock() - bg.arrival_s) / 60.0, abs=0.001)


@pytest.mark.parametrize("decode_budget", [0, 2])
def test_the_live_prefill_budget_and_decode_grant_are_the_planned_rounds(decode_budget: int) -> None:
    """docs/scheduling.md, Decode: the seed's superfluid_prefill_budget_tokens and
    superfluid_decode_grant_tokens on /metrics are the prompt tokens the last planned round
    could prefill and the decode tokens a round grants (one per decoding lane, at most
    --tick-decode-budget)."""
    from api.metrics import SCALARS
    from scheduler.worker.metrics import WorkerMetrics

    names = {
        key: SCALARS[("metrics", key)][1]
        for key in ("prefill_budget_tokens", "decode_grant_tokens", "prefill_step_tokens")
    }
    assert names == {
        "prefill_budget_tokens": "superfluid_prefill_budget_tokens",
        "decode_grant_tokens": "superfluid_decode_grant_tokens",
        "prefill_step_tokens": "superfluid_prefill_step_tokens",
    }
    sched, engine, _ = make_scheduler(max_batch=4, tick_decode_budget=decode_budget)
    for i in range(3):
        sched.add(make_job(8, max_tokens=10_000, job_id=f"talker{i}"))
    tick(sched, engine)
    sched.add(make_job(3000, job_id="long"))
    plan = sched.step()
    stats = WorkerMetrics().collect(sched, {})
    assert stats["decode_grant_tokens"] == plan.decode_tokens == (decode_budget or 3)
    assert stats["prefill_budget_tokens"] == plan.prefill_tokens > 0
    assert stats["prefill_step_tokens"] == plan.step_tokens


def test_a_workers_aging_reorders_are_the_seeds_reorders_total_unless_the_router_gives_it() -> None:
    """docs/scheduling.md, Queues and request priority: a worker's ``reorders_aging`` is
    llamaswap_scheduler_reorders_total{reason="aging"} on /metrics; with several models the
    router's family replaces the workers' (the page named the snapshot key alone, which no
    operator reads)."""
    from api.metrics import LABELLED_COUNTERS, ROUTER_COUNTERS, ROUTER_OVERRIDES

    _help, label, keys = LABELLED_COUNTERS["llamaswap_scheduler_reorders_total"]
    assert (label, keys["aging"]) == ("reason", "reorders_aging")
    assert ROUTER_COUNTERS["reorders"][0] == "llamaswap_scheduler_reorders_total"
    assert "llamaswap_scheduler_reorders" in ROUTER_OVERRIDES  # (prometheus_client's family name)


@pytest.mark.parametrize(("name", "watermarks"), [("llamacpp", False), ("mlx", True)])
def test_the_worker_runs_llama_cpp_without_the_watermarks_and_both_engines_at_the_seeds_tick_targets(
    name: str, watermarks: bool
) -> None:
    """docs/scheduling.md: runengine's worker runs llama.cpp with the occupancy watermarks off (its
    KV is fixed per sequence: an eviction frees nothing) and MLX with them on, and both at the
    seed's tick targets, 50 ms while a lane is free and 250 ms while every lane is busy, the busy
    one also bounding a prefill tick beside decoding lanes."""
    from pathlib import Path

    from scheduler.core.scheduler import SchedulerConfig
    from scheduler.engines.sim import SimEngine
    from scheduler.management.commands.runengine import engine_worker

    engine = SimEngine(n_lanes=2)
    engine.name = name
    options = {"model_name": "m", "completion_deadline_ms": 0, "stream_interval_ms": 50, "os_pressure": "off"}
    config = engine_worker(engine, SchedulerConfig(max_batch=2), options, Path("/m.gguf")).scheduler.config
    assert config.watermarks is watermarks
    assert config.tick_targets_s == (0.05, 0.25) and config.decoding_prefill_cap_s == 0.25
