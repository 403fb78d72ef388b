"""Preemption: an interactive or completion job queued with every lane busy takes a lower lane;
the preempted job parks (or recomputes), requeues at the head of its class, and resumes with a
stream that neither repeats nor changes a token."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scheduler.core.qos import QosClass
from scheduler.core.scheduler import Scheduler
from scheduler.core.types import Event, Job, TickPlan
from scheduler.engines.base import EngineError
from scheduler.engines.sim import SimEngine, SimParked

from .builders import make_job, make_scheduler, outputs, run_until_idle, tick


@dataclass
class Recording:
    """Every plan and event of a run, and the tokens the engine actually fed per job."""

    plans: list[TickPlan] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    fed: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # job -> (tick, n tokens)

    def plans_binding(self, job_id: str) -> list[TickPlan]:
        return [p for p in self.plans if any(b.job_id == job_id for b in p.bind)]

    def tokens_fed(self, job_id: str) -> int:
        return sum(n for _, n in self.fed.get(job_id, []))

    def kinds(self, job_id: str) -> list[str]:
        return [e.kind for e in self.events if e.job_id == job_id and e.kind != "token"]


def recorded_tick(sched: Scheduler, engine: SimEngine, rec: Recording) -> list[Event]:
    plan = sched.step()
    result = engine.execute(plan, lambda: False)
    lane_job = {f.lane: f.job_id for f in plan.feeds}
    for lane, n in result.fed.items():
        rec.fed.setdefault(lane_job[lane], []).append((plan.tick, n))
    events = sched.commit(result)
    rec.plans.append(plan)
    rec.events += events
    return events


def bg_stream(rec: Recording) -> list[str]:
    kinds = ("token", "preempted", "resumed")
    return [e.kind for e in rec.events if e.job_id == "bg" and e.kind in kinds]


def recorded_run_until_idle(sched: Scheduler, engine: SimEngine, rec: Recording) -> None:
    for _ in range(1000):
        if not sched.jobs:
            return
        recorded_tick(sched, engine, rec)
    raise AssertionError("scheduler did not go idle")


def undisturbed_output(job: Job) -> list[int]:
    """The tokens the same prompt yields alone on a fresh scheduler, nothing preempting it."""
    sched, engine, _ = make_scheduler(max_batch=1)
    sched.add(make_job(len(job.prompt), max_tokens=job.max_tokens, qos=job.qos, job_id=job.job_id))
    sched.jobs[job.job_id].prompt = list(job.prompt)
    return outputs(run_until_idle(sched, engine))[job.job_id]


def start(sched: Scheduler, engine: SimEngine, jobs: list[Job], ticks: int = 2) -> None:
    """Add jobs one tick apart (so admission times differ) and run until all decode."""
    for job in jobs:
        sched.add(job)
        tick(sched, engine)
    for _ in range(ticks):
        tick(sched, engine)


def running(max_batch: int, jobs: list[Job], ticks: int = 2) -> tuple[Scheduler, SimEngine]:
    """A scheduler with ``max_batch`` lanes that ``start`` filled with ``jobs``."""
    sched, engine, _ = make_scheduler(max_batch=max_batch)
    start(sched, engine, jobs, ticks)
    return sched, engine


def busy(job_id: str, qos: QosClass, prompt_tokens: int = 16, batch_invariant: bool = False) -> Job:
    """A job of 100 tokens: it still holds its lane when the test's arrival comes."""
    return make_job(prompt_tokens, max_tokens=100, qos=qos, job_id=job_id, batch_invariant=batch_invariant)


def chat(job_id: str = "chat", max_tokens: int = 3, qos: QosClass = QosClass.INTERACTIVE) -> Job:
    return make_job(8, max_tokens=max_tokens, qos=qos, job_id=job_id)


def arrive(sched: Scheduler, job: Job | None = None) -> TickPlan:
    """The plan of the tick after ``job`` (a chat unless given) is queued."""
    sched.add(job or chat())
    return sched.step()


# -- who is preempted -------------------------------------------------------------------------


def test_an_interactive_job_takes_the_lane_of_the_lowest_class_running_job() -> None:
    sched, engine = running(3, [busy("agent1", QosClass.AGENT), busy("bg", QosClass.BACKGROUND), busy("agent2", QosClass.AGENT)])
    plan = arrive(sched)
    assert plan.park == [(1, "bg")]
    assert [(b.lane, b.job_id) for b in plan.bind] == [(1, "chat")]
    events = sched.commit(engine.execute(plan, lambda: False))
    assert [(e.kind, e.job_id, e.lane) for e in events if e.kind in ("preempted", "admitted")] == [
        ("preempted", "bg", 1),
        ("admitted", "chat", 1),
    ]
    assert [j.job_id if j else None for j in sched.lanes] == ["agent1", "chat", "agent2"]
    assert sched.counters["preemptions"] == 1


def test_a_prefilling_background_job_is_preempted_before_a_decoding_agent() -> None:
    sched, _ = running(2, [busy("agent", QosClass.AGENT), busy("bg-prefilling", QosClass.BACKGROUND, 3000)], ticks=0)
    assert sched.jobs["bg-prefilling"].prefilling and not sched.jobs["agent"].prefilling
    assert arrive(sched).park == [(1, "bg-prefilling")]


def test_a_decoding_victim_is_chosen_before_a_prefilling_one_of_the_same_class() -> None:
    sched, _ = running(2, [busy("bg-decoding", QosClass.BACKGROUND), busy("bg-prefilling", QosClass.BACKGROUND, 3000)], ticks=0)
    assert sched.jobs["bg-prefilling"].prefilling and not sched.jobs["bg-decoding"].prefilling
    assert arrive(sched).park == [(0, "bg-decoding")]
    assert sched.lanes[1] is not None and sched.lanes[1].job_id == "bg-prefilling"


def test_among_equal_victims_the_most_recently_admitted_is_preempted() -> None:
    sched, _ = running(3, [busy(f"bg{i}", QosClass.BACKGROUND) for i in range(3)])
    assert arrive(sched).park == [(2, "bg2")]


def test_among_equal_victims_a_resumed_job_counts_as_admitted_when_it_resumed() -> None:
    """bg0 is admitted first, preempted (decoding before the prefilling bg1) and resumed after
    bg1's admission: it is now the most recently admitted, the one whose lane has done the least
    work since, so the next chat takes its lane again rather than bg1's."""
    long = make_job(16, max_tokens=1000, qos=QosClass.BACKGROUND, job_id="bg0")
    sched, engine = running(2, [long, busy("bg1", QosClass.BACKGROUND, 3000)], ticks=0)
    plan = arrive(sched, chat("chat1"))
    assert plan.park == [(0, "bg0")]
    sched.commit(engine.execute(plan, lambda: False))
    bg0, bg1 = sched.jobs["bg0"], sched.jobs["bg1"]
    while bg0.lane is None or bg1.prefilling:
        tick(sched, engine)
    assert bg1.admitted_s is not None and bg0.admitted_s is not None and bg0.admitted_s < bg1.admitted_s
    lane = bg0.lane
    assert arrive(sched, chat("chat2")).park == [(lane, "bg0")]


def test_a_completion_job_also_preempts_but_never_an_interactive_lane() -> None:
    sched, engine = running(2, [busy("chat-running", QosClass.INTERACTIVE), busy("agent", QosClass.AGENT)])
    plan = arrive(sched, chat("fim", qos=QosClass.COMPLETION))
    assert plan.park == [(1, "agent")]
    sched.commit(engine.execute(plan, lambda: False))
    plan = arrive(sched, chat("fim2", qos=QosClass.COMPLETION))
    assert not plan.park and not plan.release and not plan.bind
    assert sched.queues.depth(QosClass.COMPLETION) == 1


def test_a_batch_invariant_lane_is_never_preempted() -> None:
    sched, engine = running(2, [busy("bg-invariant", QosClass.BACKGROUND, batch_invariant=True), busy("agent", QosClass.AGENT)])
    plan = arrive(sched, chat("chat1"))
    assert plan.park == [(1, "agent")]  # the agent goes, though background is the lower class
    sched.commit(engine.execute(plan, lambda: False))

    plan = arrive(sched, chat("chat2"))
    assert not plan.park and not plan.release and not plan.bind
    assert {f.job_id for f in plan.feeds} <= {"chat1", "bg-invariant"}
    assert sched.jobs["chat2"].lane is None


def test_an_agent_job_arriving_with_every_lane_busy_preempts_nothing() -> None:
    sched, engine = running(2, [busy(f"bg{i}", QosClass.BACKGROUND) for i in range(2)])
    sched.add(make_job(max_tokens=3, qos=QosClass.AGENT, job_id="agent"))
    events: list[Event] = []
    for _ in range(5):
        events += tick(sched, engine)
    assert not [e for e in events if e.kind in ("preempted", "admitted")]
    assert [j.job_id if j else None for j in sched.lanes] == ["bg0", "bg1"]
    assert sched.counters["preemptions"] == 0


def test_with_preemption_off_an_interactive_job_waits_for_a_free_lane() -> None:
    sched, engine, _ = make_scheduler(max_batch=1, preemption=False)
    start(sched, engine, [make_job(max_tokens=6, qos=QosClass.BACKGROUND, job_id="bg")])
    sched.add(chat())
    events = run_until_idle(sched, engine)
    assert [(e.kind, e.job_id) for e in events if e.kind != "token"] == [
        ("finished", "bg"),
        ("admitted", "chat"),
        ("finished", "chat"),
    ]


# -- what happens to the preempted job --------------------------------------------------------


def preempt_after(victim: Job, victim_tokens: int, park: bool = True, **config: Any) -> Recording:
    """One lane: ``victim`` runs until it has ``victim_tokens`` tokens out, then a chat arrives;
    run until both finish (``config``: more of the scheduler's settings)."""
    sched, engine, _ = make_scheduler(max_batch=1, park=park, **config)
    rec = Recording()
    sched.add(victim)
    while len(victim.output) < victim_tokens:
        recorded_tick(sched, engine, rec)
    sched.add(chat())
    recorded_run_until_idle(sched, engine, rec)
    return rec


def test_the_preempted_job_is_parked_and_resumed_from_its_parked_cache() -> None:
    victim = make_job(40, max_tokens=12, qos=QosClass.BACKGROUND, job_id="bg")
    rec = preempt_after(victim, victim_tokens=5)
    (preempting,) = [p for p in rec.plans if p.park]
    assert preempting.park == [(0, "bg")] and not preempting.release
    (resuming,) = [p for p in rec.plans if p.restore]
    assert [(r.lane, r.job_id) for r in resuming.restore] == [(0, "bg")]
    artifact = resuming.restore[0].artifact
    assert isinstance(artifact, SimParked)
    assert artifact.tokens == victim.prompt + victim.output[:4]  # the 5th token was not fed yet
    # the lane's sampler is bound with the same artifact: the engine reads its random stream's place there
    (bind,) = [b for b in resuming.bind if b.job_id == "bg"]
    assert bind.lane == 0 and bind.parked is artifact and bind.history == victim.output[:5]
    assert rec.kinds("bg") == ["admitted", "preempted", "resumed", "finished"]
    assert victim.preemptions == 1


def test_a_resumed_job_does_not_prefill_its_prompt_again() -> None:
    victim = make_job(40, max_tokens=12, qos=QosClass.BACKGROUND, job_id="bg")
    rec = preempt_after(victim, victim_tokens=5)
    (resuming,) = [p for p in rec.plans if p.restore]
    after_resume = [n for t, n in rec.fed["bg"] if t >= resuming.tick]
    assert after_resume == [1] * 7  # tokens 5..11 fed one per tick to sample tokens 6..12
    assert rec.tokens_fed("bg") == 40 + 12 - 1  # every token in the KV exactly once


def test_a_parked_and_resumed_job_outputs_exactly_what_it_would_undisturbed() -> None:
    victim = make_job(40, max_tokens=12, qos=QosClass.BACKGROUND, job_id="bg")
    expected = undisturbed_output(victim)
    rec = preempt_after(victim, victim_tokens=5)
    assert outputs(rec.events)["bg"] == expected
    assert victim.output == expected
    assert victim.finish_reason == "length"


def test_a_job_preempted_mid_prefill_resumes_its_prefill_where_it_stopped() -> None:
    sched, engine, _ = make_scheduler(max_batch=1, initial_prefill_tokens_per_s=256.0)
    rec = Recording()
    victim = make_job(3000, max_tokens=4, qos=QosClass.BACKGROUND, job_id="bg")
    expected = undisturbed_output(victim)
    sched.add(victim)
    recorded_tick(sched, engine, rec)
    done_before = victim.computed
    assert done_before == 2048  # 8 s of prefill at 256 tok/s: nothing else could be admitted
    sched.add(chat())
    recorded_run_until_idle(sched, engine, rec)
    (resuming,) = [p for p in rec.plans if p.restore]
    assert len(resuming.restore[0].artifact.tokens) == done_before
    assert rec.tokens_fed("bg") == 3000 + 4 - 1
    assert outputs(rec.events)["bg"] == expected


def test_the_preempted_job_returns_to_the_head_of_its_class() -> None:
    sched, engine, _ = make_scheduler(max_batch=1)
    rec = Recording()
    victim = make_job(max_tokens=10, qos=QosClass.BACKGROUND, job_id="bg-victim")
    sched.add(victim)
    recorded_tick(sched, engine, rec)
    recorded_tick(sched, engine, rec)
    # Queued while the victim runs, with a higher priority than the victim's.
    sched.add(make_job(max_tokens=2, qos=QosClass.BACKGROUND, priority=5, job_id="bg-waiting"))
    sched.add(make_job(max_tokens=2, qos=QosClass.BACKGROUND, job_id="bg-later"))
    recorded_tick(sched, engine, rec)
    sched.add(chat())
    recorded_run_until_idle(sched, engine, rec)
    order = [e.job_id for e in rec.events if e.kind in ("admitted", "resumed")]
    assert order == ["bg-victim", "chat", "bg-victim", "bg-waiting", "bg-later"]


def test_the_preempted_jobs_stream_pauses_and_resumes_with_nothing_repeated() -> None:
    victim = make_job(40, max_tokens=12, qos=QosClass.BACKGROUND, job_id="bg")
    expected = undisturbed_output(victim)
    rec = preempt_after(victim, victim_tokens=5)
    assert bg_stream(rec) == ["token"] * 5 + ["preempted", "resumed"] + ["token"] * 7
    assert outputs(rec.events)["bg"][5:] == expected[5:]  # the 6th event is the 6th token


def test_without_parking_the_preempted_job_recomputes_its_prompt_and_output() -> None:
    victim = make_job(40, max_tokens=12, qos=QosClass.BACKGROUND, job_id="bg")
    rec = preempt_after(victim, victim_tokens=5, park=False)
    (preempting,) = [p for p in rec.plans if any(b.job_id == "chat" for b in p.bind)]
    assert preempting.release == [0] and not preempting.park
    assert not any(p.restore for p in rec.plans)
    (rebinding,) = [p for p in rec.plans_binding("bg") if p.tick > preempting.tick]
    assert rebinding.bind[0].history == victim.output[:5]  # sampler state sees what was generated
    (refeed,) = [f for f in rebinding.feeds if f.job_id == "bg"]
    assert refeed.start_pos == 0 and refeed.tokens == victim.prompt + victim.output[:5]
    assert refeed.sample
    # 44 tokens in the KV before preemption, the same 44 plus the 5th output token again after.
    assert rec.tokens_fed("bg") == (40 + 12 - 1) + 44


def test_without_parking_the_recomputed_job_outputs_exactly_what_it_would_undisturbed() -> None:
    victim = make_job(40, max_tokens=12, qos=QosClass.BACKGROUND, job_id="bg")
    expected = undisturbed_output(victim)
    rec = preempt_after(victim, victim_tokens=5, park=False)
    assert outputs(rec.events)["bg"] == expected
    assert victim.output == expected


def test_without_parking_the_recomputed_jobs_stream_repeats_nothing() -> None:
    victim = make_job(40, max_tokens=12, qos=QosClass.BACKGROUND, job_id="bg")
    expected = undisturbed_output(victim)
    rec = preempt_after(victim, victim_tokens=5, park=False)
    assert bg_stream(rec) == ["token"] * 5 + ["preempted", "resumed"] + ["token"] * 7
    assert outputs(rec.events)["bg"][5:] == expected[5:]  # not a re-sampled first token


def recomputed_after_a_chat(victim: Job, outputs_before: int) -> tuple[Recording, list[int]]:
    """``victim`` alone on one lane without parking, a 64-token prefill budget, preempted by a
    chat once it has ``outputs_before`` tokens out, then run to the end: the recording, and the
    token counts fed for it from its rebinding on."""
    rec = preempt_after(victim, outputs_before, park=False, prefill_budget=64)
    rebind = max(p.tick for p in rec.plans_binding(victim.job_id))
    return rec, [n for t, n in rec.fed[victim.job_id] if t >= rebind]


def test_a_recomputation_longer_than_the_prefill_budget_still_resumes_exactly() -> None:
    victim = make_job(100, max_tokens=40, qos=QosClass.BACKGROUND, job_id="bg")
    expected = undisturbed_output(victim)
    rec, refed = recomputed_after_a_chat(victim, outputs_before=30)
    assert refed[:3] == [64, 64, 2]  # 130 tokens again
    assert victim.output == expected
    assert outputs(rec.events)["bg"] == expected


def test_recomputing_an_output_longer_than_the_prompt_keeps_to_the_prefill_budget() -> None:
    """A short prompt with a long reply: once the recomputation passes the prompt, the output
    it feeds again is still prefill work, in budget-sized chunks, not one huge tick."""
    victim = make_job(40, max_tokens=400, qos=QosClass.BACKGROUND, job_id="bg")
    expected = undisturbed_output(victim)
    rec, refed = recomputed_after_a_chat(victim, outputs_before=300)
    assert refed[:7] == [64] * 5 + [20, 1]  # prompt and output so far (340) again, then decoding
    assert all(p.prefill_tokens <= 64 for p in rec.plans)
    assert victim.output == expected


def test_the_interactive_job_that_preempted_gets_its_first_token_in_the_same_tick() -> None:
    victim = make_job(40, max_tokens=12, qos=QosClass.BACKGROUND, job_id="bg")
    rec = preempt_after(victim, victim_tokens=5)
    (preempting,) = [p for p in rec.plans if p.park]
    assert [t for t, _ in rec.fed["chat"]][0] == preempting.tick
    assert [f.sample for f in preempting.feeds if f.job_id == "chat"] == [True]


class SaveFails(SimEngine):
    """An engine that cannot save a lane's KV (llama.cpp's ``llama_state_seq_get_data`` writing nothing)."""

    def save(self, seq: int) -> Any:
        if seq < self.n_lanes:
            raise EngineError(f"could not copy lane {seq}'s KV cache", permanent=False)
        return super().save(seq)


def test_a_park_the_engine_could_not_make_is_not_counted_as_a_park() -> None:
    """``parks`` (``superfluid_parks_total``: lanes whose KV was parked to host memory) counts
    the parks made: one whose save failed recomputes its job, as a preemption without parking
    (a failed restore likewise takes back its resume). It counted every park planned."""
    sched, _, clock = make_scheduler(max_batch=2)
    engine = SaveFails(n_lanes=2, lane_ctx=sched.config.lane_ctx, clock=clock, cache_slots=sched.config.cache_slots)
    start(sched, engine, [busy("agent", QosClass.AGENT), busy("bg", QosClass.BACKGROUND)])
    plan = arrive(sched)
    assert plan.park == [(1, "bg")]
    sched.commit(engine.execute(plan, lambda: False))
    assert sched.jobs["bg"].computed == 0 and sched.jobs["bg"].parked is None  # recomputed
    assert sched.counters["preemptions"] == 1 and sched.counters["parks"] == 0
    run_until_idle(sched, engine)
    assert sched.counters["resumes"] == 0


def test_a_park_in_a_plan_the_engine_failed_is_not_counted_as_a_park() -> None:
    sched, engine = running(2, [busy("agent", QosClass.AGENT), busy("bg", QosClass.BACKGROUND)])
    assert arrive(sched).park == [(1, "bg")]
    sched.on_engine_failed()  # the plan failed: its park never reached the scheduler
    assert sched.jobs["bg"].computed == 0
    assert sched.counters["parks"] == 0


def test_among_victims_admitted_in_the_same_tick_the_one_admitted_last_is_preempted() -> None:
    """Two agents admitted in one tick (so at one clock time): the batch-priority one was
    admitted after the normal one, so it is the most recently admitted and loses its lane to a
    chat, not the normal job that its priority put first (lane order decided it before)."""
    sched, engine, clock = make_scheduler(max_batch=2)
    sched.add(make_job(16, max_tokens=100, job_id="normal", priority=0))
    sched.add(make_job(16, max_tokens=100, job_id="batch", priority=-100))
    tick(sched, engine)
    tick(sched, engine)
    normal, batch = sched.jobs["normal"], sched.jobs["batch"]
    assert normal.last_admitted_s == batch.last_admitted_s and not normal.prefilling and not batch.prefilling
    assert (normal.lane, batch.lane) == (0, 1)
    plan = arrive(sched)
    assert plan.park == [(1, "batch")]
    assert sched.jobs["normal"].lane == 0
