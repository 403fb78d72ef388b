"""Kept lanes: a finished job's KV stays in its lane, and the next job whose prompt starts with
it (an agent's next turn: the last prompt, the reply, then the new message) takes that lane
and feeds only what is new, with no copy; as llama-server's slots keep their prompt cache."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.scheduler import Scheduler
from scheduler.core.types import Job
from scheduler.engines.sim import SimEngine

from .builders import make_job, make_scheduler, run_until_idle, tick


def next_turn(previous: Job, new_tokens: int, job_id: str) -> Job:
    """The conversation's next request: everything the last one saw and said, then more."""
    job = make_job(new_tokens, job_id=job_id, max_tokens=previous.max_tokens)
    job.prompt = previous.prompt + previous.output + job.prompt
    job.cache_scope = previous.cache_scope
    return job


def assert_kv_matches(sched: Scheduler, engine: SimEngine) -> None:
    """Every busy lane's KV is its job's computed tokens; every kept lane's is what it kept."""
    for lane, job in enumerate(sched.lanes):
        if job is not None and job.share_from is None:
            assert engine.kv[lane] == job.sequence[: job.computed], f"lane {lane} holds other tokens than {job.job_id}'s"
    for lane, kept in sched._kept.items():
        if lane not in sched._release_keep:
            assert engine.kv[lane] == kept.tokens


def test_an_agents_next_turn_takes_its_lane_back_and_feeds_only_the_new_tokens() -> None:
    sched, engine, _ = make_scheduler(max_batch=2)
    first = make_job(300, job_id="turn1", max_tokens=12)
    sched.add(first)
    run_until_idle(sched, engine)
    lane_kv = list(engine.kv[0])
    assert lane_kv == first.sequence[:-1]  # the last sampled token was never fed

    second = next_turn(first, 40, "turn2")
    sched.add(second)
    plan = sched.step()
    assert not plan.pool.copy and not plan.pool.store  # nothing copied: the lane already holds it
    assert plan.trim == [(0, len(lane_kv))] and [b.lane for b in plan.bind] == [0]
    assert [len(f.tokens) for f in plan.feeds] == [len(second.prompt) - len(lane_kv)]
    sched.commit(engine.execute(plan, lambda: False))
    run_until_idle(sched, engine)
    assert second.cached_tokens == len(lane_kv) and sched.pool.counters["prefix_tokens_reused"] == len(lane_kv)


def test_the_turn_takes_the_lane_that_kept_its_prefix_over_an_empty_one() -> None:
    sched, engine, _ = make_scheduler(max_batch=3)
    a, b = make_job(200, job_id="a", max_tokens=4), make_job(200, job_id="b", max_tokens=4)
    sched.add(a)
    sched.add(b)
    run_until_idle(sched, engine)  # a in lane 0, b in lane 1; lane 2 never used
    b2 = next_turn(b, 20, "b2")
    sched.add(b2)
    tick(sched, engine)
    assert b2.lane == 1 and b2.cached_tokens == len(b.sequence) - 1


@pytest.mark.parametrize("shared_opening", [0, 5], ids=["nothing shared", "a chat template's opening shared"])
def test_a_job_sharing_little_takes_an_empty_lane_and_leaves_the_kept_one_to_its_conversation(shared_opening: int) -> None:
    """A prompt that shares nothing with a kept lane, or only its first tokens (a chat
    template's opening), takes an empty lane: the kept conversation's next turn, arriving while
    the newcomer still runs, still finds all of its KV."""
    sched, engine, _ = make_scheduler(max_batch=2)
    a = make_job(200, job_id="a", max_tokens=4)
    sched.add(a)
    run_until_idle(sched, engine)
    newcomer = make_job(50, job_id="newcomer", max_tokens=30)
    newcomer.prompt = a.prompt[:shared_opening] + newcomer.prompt[shared_opening:]
    sched.add(newcomer)
    tick(sched, engine)
    assert newcomer.lane == 1 and newcomer.cached_tokens == 0
    a2 = next_turn(a, 10, "a2")
    sched.add(a2)
    tick(sched, engine)
    assert a2.lane == 0 and a2.cached_tokens == len(a.sequence) - 1


def test_a_short_prompt_sent_again_takes_its_lane_back_and_feeds_only_its_last_token() -> None:
    """Below min_prefix_tokens (32), a lane that holds the whole prompt still counts: a retry, a
    regenerate or a fixed prompt prefills one token, as on llama-server's slots."""
    sched, engine, _ = make_scheduler(max_batch=2)
    first = make_job(20, job_id="first", max_tokens=6)
    sched.add(first)
    run_until_idle(sched, engine)
    again = make_job(20, job_id="again", max_tokens=6)
    again.prompt = list(first.prompt)
    sched.add(again)
    plan = sched.step()
    assert [b.lane for b in plan.bind] == [0] and plan.trim == [(0, 19)]
    assert [len(f.tokens) for f in plan.feeds] == [1]
    sched.commit(engine.execute(plan, lambda: False))
    run_until_idle(sched, engine)
    assert again.cached_tokens == 19 and again.output == first.output  # the same reply, one token fed


def test_with_every_lane_kept_the_one_kept_longest_ago_is_emptied_first() -> None:
    sched, engine, clock = make_scheduler(max_batch=2)
    for job_id in ("old", "new"):
        sched.add(make_job(100, job_id=job_id, max_tokens=2))
        run_until_idle(sched, engine)
        clock.advance(5)
    old_lane = 0
    assert set(sched._kept) == {0, 1} and sched._kept[old_lane].kept_s < sched._kept[1].kept_s
    stranger = make_job(50, job_id="stranger", max_tokens=2)
    sched.add(stranger)
    plan = sched.step()
    assert stranger.lane == old_lane and plan.trim == [(old_lane, 0)]  # emptied, not fed on top
    sched.commit(engine.execute(plan, lambda: False))
    assert_kv_matches(sched, engine)


@pytest.mark.parametrize("shared_opening", [5, 31], ids=["a chat template's opening", "one below min_prefix_tokens"])
def test_a_kept_lane_taken_anyway_keeps_what_the_newcomer_shares_however_little(shared_opening: int) -> None:
    """With every lane kept, a newcomer takes the one kept longest ago whatever it shares. Its KV
    was emptied even where it began with the newcomer's first tokens (every chat request opens
    with its template's), and the newcomer prefilled them again; llama-server's slots keep the
    longest common prefix. Now the lane is cut to what the two share."""
    sched, engine, clock = make_scheduler(max_batch=2)
    for job_id in ("old", "new"):
        sched.add(make_job(100, job_id=job_id, max_tokens=2))
        run_until_idle(sched, engine)
        clock.advance(5)
    old_prompt = list(engine.kv[0][:shared_opening])  # lane 0 kept "old", the lane kept longest ago
    newcomer = make_job(50, job_id="newcomer", max_tokens=2)
    newcomer.prompt = old_prompt + newcomer.prompt[shared_opening:]
    sched.add(newcomer)
    plan = sched.step()
    assert newcomer.lane == 0 and plan.trim == [(0, shared_opening)]
    assert [len(f.tokens) for f in plan.feeds] == [50 - shared_opening]
    sched.commit(engine.execute(plan, lambda: False))
    assert_kv_matches(sched, engine)
    run_until_idle(sched, engine)
    assert newcomer.cached_tokens == shared_opening and newcomer.output  # it ran on the KV it kept
    assert sched.pool.counters["prefix_tokens_reused"] == shared_opening


def test_another_scope_never_reuses_a_kept_lane() -> None:
    sched, engine, _ = make_scheduler(max_batch=1)
    a = make_job(200, job_id="a", max_tokens=4)
    a.cache_scope = "policy:a"
    sched.add(a)
    run_until_idle(sched, engine)
    other = next_turn(a, 10, "other")
    other.cache_scope = "policy:b"
    sched.add(other)
    plan = sched.step()
    assert plan.trim == [(0, 0)] and other.cached_tokens == 0 and len(plan.feeds[0].tokens) == len(other.prompt)


def test_a_cancelled_job_leaves_what_it_had_computed() -> None:
    sched, engine, _ = make_scheduler(max_batch=1, prefill_budget=64)
    a = make_job(400, job_id="a", max_tokens=50)
    sched.add(a)
    for _ in range(3):
        tick(sched, engine)
    assert 0 < a.computed < len(a.prompt)
    computed = a.computed
    sched.cancel("a")
    again = make_job(10, job_id="again")
    again.prompt = a.prompt + again.prompt  # the client retried
    sched.add(again)
    tick(sched, engine)
    assert again.cached_tokens == computed


def test_nothing_is_kept_with_the_prefix_cache_or_lane_keeping_off() -> None:
    for flags in ({"prefix_cache": False}, {"keep_lanes": False}):
        sched, engine, _ = make_scheduler(max_batch=1, **flags)
        a = make_job(200, job_id="a", max_tokens=4)
        sched.add(a)
        run_until_idle(sched, engine)
        assert engine.kv[0] == [] or not sched._kept
        a2 = next_turn(a, 10, "a2")
        sched.add(a2)
        run_until_idle(sched, engine)
        assert a2.cached_tokens == 0, flags


def test_a_refused_plan_empties_the_kept_lanes() -> None:
    sched, engine, _ = make_scheduler(max_batch=2)
    sched.add(make_job(200, job_id="a", max_tokens=4))
    run_until_idle(sched, engine)
    assert sched._kept
    sched.on_plan_rejected()
    plan = sched.step()
    assert 0 in plan.release and not sched._kept
    sched.commit(engine.execute(plan, lambda: False))
    assert engine.kv[0] == []


def test_with_kv_fixed_per_lane_pressure_and_a_refused_plan_leave_the_kept_lanes() -> None:
    """llama.cpp (watermarks off): a kept lane's cells are the lane's whatever it holds, so
    emptying it on an OS pressure rise or a refused plan would free nothing and lose the next
    turn's prefix."""
    sched, engine, _ = make_scheduler(max_batch=2, watermarks=False)
    first = make_job(300, job_id="turn1", max_tokens=12)
    sched.add(first)
    run_until_idle(sched, engine)
    lane_kv = list(engine.kv[0])
    sched.on_os_pressure("critical")
    tick(sched, engine)
    assert list(sched._kept) == [0] and engine.kv[0] == lane_kv
    sched.on_plan_rejected()
    tick(sched, engine)
    assert list(sched._kept) == [0] and engine.kv[0] == lane_kv
    second = next_turn(first, 40, "turn2")
    sched.add(second)
    run_until_idle(sched, engine)
    assert second.cached_tokens == len(lane_kv)


def test_kept_lanes_yield_to_the_pool_watermark_on_engines_whose_kv_grows() -> None:
    """MLX's caches grow with use: a kept lane holds memory, and it is the first thing the
    high watermark takes (before any cached prefix)."""
    sched, engine, _ = make_scheduler(max_batch=2, lane_ctx=512, cache_slots=1, pressure_high=0.5, pressure_low=0.3)
    short, long = make_job(400, job_id="short", max_tokens=2), make_job(400, job_id="long", max_tokens=60)
    sched.add(short)
    sched.add(long)
    while short.finish_reason is None:
        tick(sched, engine)
    assert sched._kept  # alone it would be 26 of 96 blocks
    tick(sched, engine)  # beside the running lane: 52 of 96 blocks, past the 50% mark
    assert not sched._kept and engine.kv[0] == []
    run_until_idle(sched, engine)
    assert list(sched._kept) == [1]  # alone again: kept


def test_a_batch_invariant_job_neither_keeps_nor_reuses_a_lane() -> None:
    sched, engine, _ = make_scheduler(max_batch=1)
    a = make_job(200, job_id="a", max_tokens=4)
    sched.add(a)
    run_until_idle(sched, engine)
    bi = next_turn(a, 10, "bi")
    bi.batch_invariant = True
    sched.add(bi)
    run_until_idle(sched, engine)
    assert bi.cached_tokens == 0 and not sched._kept


def test_a_batch_invariant_job_takes_an_empty_lane_and_leaves_a_kept_one_that_shares_its_prompt() -> None:
    """It may reuse nothing, so a kept lane's KV is no reason for it to take that lane: it took
    the lane that shared its prompt all the same and emptied it, and the conversation's own next
    turn then prefilled everything again (no test held this: "neither keeps nor reuses" held)."""
    sched, engine, _ = make_scheduler(max_batch=2)
    a = make_job(200, job_id="a", max_tokens=4)
    sched.add(a)
    run_until_idle(sched, engine)
    kept_lane = next(iter(sched._kept))
    bi = next_turn(a, 10, "bi")
    bi.batch_invariant = True
    sched.add(bi)
    tick(sched, engine)
    assert bi.lane is not None and bi.lane != kept_lane
    run_until_idle(sched, engine)
    turn = next_turn(a, 10, "a2")
    sched.add(turn)
    run_until_idle(sched, engine)
    assert turn.cached_tokens == len(a.prompt) + len(a.output) - 1  # all but the last token, never fed


conversation = st.lists(
    st.tuples(
        st.integers(0, 3),  # which conversation
        st.integers(1, 60),  # new tokens this turn
        st.integers(1, 12),  # max_tokens
        st.sampled_from(["", "policy:a"]),  # scope (a conversation keeps its first)
        st.integers(0, 4),  # ticks before the next request arrives
        st.booleans(),  # cancel the turn after those ticks
    ),
    min_size=1,
    max_size=24,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=conversation, max_batch=st.integers(1, 4), prefill_budget=st.sampled_from([64, 4096]))
def test_every_lane_holds_exactly_its_jobs_tokens_and_every_reply_is_what_its_prompt_gives(
    turns: list[tuple[int, int, int, str, int, bool]], max_batch: int, prefill_budget: int
) -> None:
    """Conversations in any interleaving, with cancels: at every tick a busy lane's KV is its
    job's tokens and a kept lane's is what it kept; every reply is the one its prompt gives
    alone (the sim's next token is a function of the sequence: a reused prefix that was not
    the prompt's would change it)."""
    sched, engine, _ = make_scheduler(max_batch=max_batch, prefill_budget=prefill_budget, min_prefix_tokens=8)
    last: dict[int, Job] = {}
    jobs: list[Job] = []
    for i, (conv, new, max_tokens, scope, wait, cancel) in enumerate(turns):
        job = make_job(new, job_id=f"c{conv}t{i}", max_tokens=max_tokens)
        if conv in last:
            job.prompt = last[conv].prompt + last[conv].output + job.prompt
            job.cache_scope = last[conv].cache_scope
        else:
            job.cache_scope = scope
        last[conv] = job
        jobs.append(job)
        sched.add(job)
        for _ in range(wait):
            tick(sched, engine)
            assert_kv_matches(sched, engine)
        if cancel:
            sched.cancel(job.job_id)
    for _ in range(10_000):
        if not sched.jobs:
            break
        tick(sched, engine)
        assert_kv_matches(sched, engine)
    assert not sched.jobs
    for job in jobs:
        expected = [SimEngine.next_token(job.prompt + job.output[:k]) for k in range(len(job.output))]
        assert job.output == expected, job.job_id
    reused = sum(j.cached_tokens for j in jobs)
    assert reused == sched.pool.counters["prefix_tokens_reused"]


def test_the_pools_blocks_in_use_count_a_kept_lanes_kv_where_it_holds_memory() -> None:
    """On MLX (watermarks on) a kept lane's KV is memory the lane holds after its job ended: the
    pool figure (superfluid_pool_blocks_used, the dashboard's KV pool) left it out, and read
    near empty while kept lanes held most of the memory. On llama.cpp it costs nothing more."""
    for watermarks in (True, False):
        sched, engine, _ = make_scheduler(max_batch=2, watermarks=watermarks)
        job = make_job(300, job_id="done", max_tokens=4)
        sched.add(job)
        run_until_idle(sched, engine)
        assert sched._kept, "the finished job's lane is kept"
        pool = sched.snapshot()["pool"]
        assert isinstance(pool, dict)
        kept = [len(job.sequence) - 1]  # the last sampled token was never fed
        assert pool["blocks_used"] == sched.pool.used_blocks(kept if watermarks else [])
        assert pool["blocks_used"] > sched.pool.cached_blocks() or not watermarks
