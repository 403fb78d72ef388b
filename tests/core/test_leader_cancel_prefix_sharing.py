"""Jobs waiting for a leader's prompt prefix (``share_from``) when the leader leaves before its
prefill is done: the prefix should still be prefilled once for them, not once per waiter.

Concurrent requests with one prompt (``n`` > 1 choices are such jobs) are documented to prefill
it once (docs/scheduling.md, ``cached_tokens``). When the first of them is cancelled (its client
left) part way through its prefill, one of the jobs that waited for it takes over as leader,
starting from what the cancelled leader's kept lane holds, and the others copy the prefix from
it (``Scheduler._share_prefixes``): not each the whole prompt on its own (3 x its tokens here)."""

from __future__ import annotations

from scheduler.core.qos import QosClass
from scheduler.core.scheduler import Scheduler, SchedulerConfig
from scheduler.core.types import Job, TickPlan
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import Cancel, Done, Submit
from scheduler.worker.loop import EngineWorker

from .builders import RecordingConn, greedy_reply, make_job, make_scheduler, outputs, run_until_idle, run_worker, tick


def test_waiters_of_a_leader_cancelled_mid_prefill_prefill_the_shared_prompt_once() -> None:
    clock = FakeClock()
    engine = SimEngine(n_lanes=3, lane_ctx=4096, clock=clock)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=3, lane_ctx=4096), model_name="sim", clock=clock)
    conn = RecordingConn()
    request = {"endpoint": "completions", "prompt": "shared prompt " * 200, "max_tokens": 5}
    for i in range(3):
        worker.handle(conn, Submit(id=f"j{i}", request=dict(request)))
    worker.run_tick()  # j0 leads the prefill, j1 and j2 wait for its prefix
    assert worker.scheduler.jobs["j0"].prefilling
    worker.handle(conn, Cancel(id="j0"))
    run_worker(worker)
    done = {m.id: m for m in conn.sent if isinstance(m, Done)}
    assert done["j1"].finish_reason == done["j2"].finish_reason == "length"
    assert conn.texts()["j1"] == conn.texts()["j2"]
    prompt = done["j1"].usage["prompt_tokens"]
    fed = sum(n for call in engine.calls for _, n in call)
    # j0's partial prefill, then the prompt once more for both waiters (plus their decodes)
    assert fed < 2 * prompt + 20
    assert max(done["j1"].usage["cached_tokens"], done["j2"].usage["cached_tokens"]) >= prompt - 1


# -- the same in the pure core: who leads next, what it starts from, scopes ----------------

SYSTEM = [7 + (i * 13) % 200 for i in range(600)]


def _shared(job_id: str, *, scope: str = "", qos: QosClass = QosClass.AGENT) -> Job:
    job = make_job(10, job_id=job_id, max_tokens=4, qos=qos)
    job.prompt = SYSTEM + job.prompt
    job.cache_scope = scope
    return job


def _prefilled(engine: SimEngine) -> int:
    return sum(n for call in engine.calls for _, n in call if n > 1)


def test_one_waiter_takes_over_from_the_cancelled_leaders_kept_lane_and_the_others_wait_for_it() -> None:
    sched, engine, _ = make_scheduler(max_batch=3, prefill_budget=64)  # 64 prompt tokens a tick
    jobs = [_shared(f"s{i}") for i in range(3)]
    for job in jobs:
        sched.add(job)
    tick(sched, engine)
    tick(sched, engine)
    lead, a, b = jobs
    assert a.share_from == b.share_from == "s0" and 0 < lead.computed < len(SYSTEM)
    partial = lead.computed
    sched.cancel("s0")
    plan = sched.step()
    # the first waiter starts from what the leader's kept lane holds, the other waits for it
    assert plan.pool.copy == [(0, 1, partial)] and not plan.pool.store
    assert a.share_from is None and a.cached_tokens == partial
    assert b.share_from == "s1" and b.computed == 0
    events = sched.commit(engine.execute(plan, lambda: False)) + run_until_idle(sched, engine)
    got = outputs(events)
    assert got["s1"] == greedy_reply(a.prompt, 4) and got["s2"] == greedy_reply(b.prompt, 4)
    assert b.cached_tokens == len(SYSTEM)
    # the leader's part, then the rest of the shared prompt once, then each waiter's own tokens
    assert _prefilled(engine) <= len(SYSTEM) + 2 * 10 + 2


def _preempted_leader(prefix_done: bool, **config: object) -> tuple[Scheduler, SimEngine, Job, list[Job], TickPlan]:
    """A background job leads the shared prompt for two agent jobs; an interactive chat takes
    its lane part way through its prefill (or in the tick it completed the prefix, before the
    waiters copied it). The plan of that preemption."""
    sched, engine, _ = make_scheduler(max_batch=3, prefill_budget=64, **config)
    lead = _shared("bg", qos=QosClass.BACKGROUND)
    waiters = [_shared(f"w{i}") for i in range(2)]
    sched.add(lead)
    tick(sched, engine)
    for job in waiters:
        sched.add(job)
    tick(sched, engine)
    while prefix_done and lead.computed < len(SYSTEM):
        tick(sched, engine)
    assert all(w.share_from == "bg" and w.computed == 0 for w in waiters)
    sched.add(make_job(40, job_id="chat", max_tokens=2, qos=QosClass.INTERACTIVE))
    plan = sched.step()
    assert plan.park == [(0, "bg")] and lead.lane is None  # the leader gives its lane to the chat
    return sched, engine, lead, waiters, plan


def _finish_and_check(sched: Scheduler, engine: SimEngine, plan: TickPlan, jobs: list[Job]) -> None:
    events = sched.commit(engine.execute(plan, lambda: False)) + run_until_idle(sched, engine)
    got = outputs(events)
    for job in jobs:
        assert got[job.job_id] == greedy_reply(job.prompt, 4)


def test_waiters_of_a_leader_preempted_mid_prefill_start_from_what_it_prefilled() -> None:
    sched, engine, lead, waiters, plan = _preempted_leader(False)
    done = 128
    # what the leader prefilled goes to a cache slot before its park; one waiter takes it over
    assert plan.pool.store == [(0, 3, done)] and plan.pool.copy == [(3, 1, done)]
    assert [w.share_from for w in waiters] == [None, "w0"] and waiters[0].cached_tokens == done
    _finish_and_check(sched, engine, plan, [lead, *waiters])
    assert waiters[1].cached_tokens == len(SYSTEM)
    # the chat's prompt; the shared prompt by the leader (after its resume too: from its parked
    # KV) and the rest of it by the waiter that took over, once; then each job's own tokens
    assert _prefilled(engine) <= 40 + len(SYSTEM) + (len(SYSTEM) - done) + 3 * 10 + 3


def test_waiters_of_a_leader_preempted_in_the_tick_its_prefix_completed_copy_it() -> None:
    sched, engine, lead, waiters, plan = _preempted_leader(True)
    assert plan.pool.store == [(0, 3, len(SYSTEM))]
    assert plan.pool.copy == [(3, 1, len(SYSTEM)), (3, 2, len(SYSTEM))]
    _finish_and_check(sched, engine, plan, [lead, *waiters])
    assert [w.cached_tokens for w in waiters] == [len(SYSTEM)] * 2
    assert _prefilled(engine) <= 40 + len(SYSTEM) + 3 * 10 + 3  # the shared prompt once


def test_without_a_cache_slot_one_waiter_of_a_preempted_leader_prefills_for_the_others() -> None:
    sched, engine, lead, waiters, plan = _preempted_leader(True, cache_slots=0)
    assert not plan.pool.store and not plan.pool.copy
    assert [w.share_from for w in waiters] == [None, "w0"]
    _finish_and_check(sched, engine, plan, [lead, *waiters])
    assert waiters[1].cached_tokens == len(SYSTEM)
    assert _prefilled(engine) <= 40 + 2 * len(SYSTEM) + 3 * 10 + 3


def test_a_waiter_taking_over_never_starts_from_another_scopes_kept_lane() -> None:
    sched, engine, _ = make_scheduler(max_batch=4, prefill_budget=64, cache_slots=0)
    sched.add(_shared("other", scope="policy:b"))
    run_until_idle(sched, engine)  # its lane keeps the whole shared prompt, in b's scope
    assert sched._kept
    jobs = [_shared(f"a{i}", scope="policy:a") for i in range(3)]
    for job in jobs:
        sched.add(job)
    tick(sched, engine)
    tick(sched, engine)
    lead, first, second = jobs
    assert first.share_from == "a0" and first.cached_tokens == 0
    sched.cancel("a0")
    plan = sched.step()
    sources = {src for src, _, _ in plan.pool.copy}
    assert sources == {lead_lane for lead_lane in sched._kept if sched._kept[lead_lane].scope == "policy:a"}
    assert first.cached_tokens < len(SYSTEM)  # only what a0 prefilled, not b's whole prompt
    sched.commit(engine.execute(plan, lambda: False))
    run_until_idle(sched, engine)
    assert second.cached_tokens == len(SYSTEM)  # copied from the waiter that took over, in a's scope


def test_a_waiter_copies_at_once_from_a_lane_another_waiter_took_a_handed_over_prefix_into() -> None:
    """Two leaders leave in one tick: ``bg``, preempted by a chat, hands over what it prefilled of
    the system prompt (stored to the one cache slot, evicting the older entry); ``l2``, cancelled,
    leaves nothing (no kept lanes). ``o1`` takes the handed-over prefix; ``o2``, an interactive
    job that shares the first 100 tokens with ``o1``, copies them from ``o1``'s lane in the same
    plan (the copy into that lane runs first, and no store reads it before the copy lands) and
    prefills in that tick, not one tick later."""
    sched, engine, _ = make_scheduler(max_batch=4, prefill_budget=64, keep_lanes=False, cache_slots=1, urgent_decode_share=0)
    other = [3 + (i * 7) % 190 for i in range(400)]
    lead = _shared("bg", qos=QosClass.BACKGROUND)
    sched.add(lead)
    tick(sched, engine)
    tick(sched, engine)
    second = make_job(10, job_id="l2", max_tokens=4)
    second.prompt = SYSTEM[:100] + other + second.prompt  # copies bg's first 100 tokens
    sched.add(second)
    tick(sched, engine)
    o1 = _shared("o1")
    o2 = make_job(10, job_id="o2", max_tokens=4, qos=QosClass.INTERACTIVE)
    o2.prompt = SYSTEM[:100] + other + o2.prompt
    sched.add(o1)
    sched.add(o2)
    tick(sched, engine)
    assert (o1.share_from, o2.share_from) == ("bg", "l2") and o1.computed == o2.computed == 0
    done = lead.computed
    assert 100 < done < len(SYSTEM) and second.computed < len(SYSTEM[:100] + other)
    sched.cancel("l2")
    for i in range(2):
        sched.add(make_job(4, job_id=f"chat{i}", max_tokens=2, qos=QosClass.INTERACTIVE))
    plan = sched.step()
    assert [job_id for _, job_id in plan.park] == ["bg"]
    slot = sched.pool.cache_seq(0)
    assert plan.pool.store == [(plan.park[0][0], slot, done)]  # the hand-over; nothing stored from o1's lane
    assert plan.pool.copy == [(slot, o1.lane, done), (o1.lane, o2.lane, 100)]
    assert o2.share_from is None and o2.cached_tokens == 100
    assert "o2" in {f.job_id for f in plan.feeds}  # its first prefill step, in this tick
    _finish_and_check(sched, engine, plan, [lead, o1, o2])
