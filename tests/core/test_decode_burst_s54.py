"""Decode bursts: with --stream-interval-ms above 0, a plan of decode rounds alone (every running
lane's one token, no job waiting, no lane or cache work) lets the engine run several rounds on its
own, each lane's sampled token fed back at once, until held text is due (it would wait that long
anyway). The scheduler's plan and commit, a few percent of a one-stream round, then run
once a burst. What a client sees must not change: the same text, the same usage and finish
reason, stop strings cutting where they did, an arrival admitted before the burst's next round,
and no text held longer than the interval and a round (test_stream_interval_s53.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.scheduler import MAX_BURST_ROUNDS, Scheduler, SchedulerConfig
from scheduler.core.types import Job, SamplingParams, TickPlan, TickResult
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import Done, Submit
from scheduler.worker.loop import EngineWorker

from .test_stream_interval_s53 import ROUND_S, TimedConn, submit, worker_with
from .test_worker_rules import run


def recorded(worker: EngineWorker) -> list[tuple[TickPlan, TickResult]]:
    """Each tick's plan and result, as the worker's engine ran them."""
    ticks: list[tuple[TickPlan, TickResult]] = []
    execute = worker.engine.execute

    def record(plan: TickPlan, should_stop: Any) -> TickResult:
        result = execute(plan, should_stop)
        ticks.append((plan, result))
        return result

    worker.engine.execute = record  # type: ignore[method-assign]
    return ticks


def done(conn: TimedConn, job_id: str) -> Done:
    [end] = [m for _, m in conn.sent if isinstance(m, Done) and m.id == job_id]
    return end


def test_a_paced_stream_decodes_in_bursts_and_its_client_sees_the_same_reply() -> None:
    every, every_conn, _ = worker_with(0)
    paced, paced_conn, _ = worker_with(50)
    every_ticks, paced_ticks = recorded(every), recorded(paced)
    for worker, conn in ((every, every_conn), (paced, paced_conn)):
        submit(worker, conn, "a", max_tokens=60)
        run(worker)
    assert paced_conn.text("a") == every_conn.text("a") and len(every_conn.text("a")) == 60
    assert done(paced_conn, "a").usage == done(every_conn, "a").usage
    assert done(paced_conn, "a").finish_reason == done(every_conn, "a").finish_reason == "length"
    assert all(result.rounds == 1 for _, result in every_ticks)
    # a burst runs until held text is due: five 10 ms rounds (a sixth where the fake clock's sum
    # falls short of 50 ms by a rounding), so a plan and a commit for several rounds
    assert round(0.05 / ROUND_S) <= max(result.rounds for _, result in paced_ticks) <= round(0.05 / ROUND_S) + 1
    assert len(paced_ticks) <= len(every_ticks) // 3
    # the first token is never in a burst: it goes out at once
    assert paced_ticks[0][1].rounds == 1 and paced_ticks[0][1].sampled
    assert paced_conn.deltas("a")[0][0] == every_conn.deltas("a")[0][0]


def test_a_burst_never_passes_max_tokens() -> None:
    for max_tokens in (2, 3, 7, 13, 31):
        worker, conn, _ = worker_with(50)
        ticks = recorded(worker)
        submit(worker, conn, "a", max_tokens=max_tokens)
        run(worker)
        assert done(conn, "a").usage["completion_tokens"] == max_tokens
        assert worker.engine.generated["a"] == max_tokens  # type: ignore[attr-defined]  # no round past it
        assert sum(len(r.earlier.get(lane, [])) + (lane in r.sampled) for _, r in ticks for lane in r.fed) == max_tokens


def test_an_end_of_generation_token_ends_the_burst_in_its_round() -> None:
    every, every_conn, _ = worker_with(0, eog_after={"a": 17})
    paced, paced_conn, _ = worker_with(50, eog_after={"a": 17})
    ticks = recorded(paced)
    for worker, conn in ((every, every_conn), (paced, paced_conn)):
        submit(worker, conn, "a", max_tokens=60)
        run(worker)
    assert paced_conn.text("a") == every_conn.text("a")
    assert done(paced_conn, "a").usage == done(every_conn, "a").usage == {**done(every_conn, "a").usage, "completion_tokens": 16}
    assert done(paced_conn, "a").finish_reason == "stop"
    assert paced.engine.generated["a"] == 17  # type: ignore[attr-defined]  # no round after the EOG
    assert any(r.rounds > 1 and r.eog for _, r in ticks)


def test_a_stop_string_inside_a_burst_cuts_the_reply_and_its_usage_where_it_did_without_one() -> None:
    """Stop strings are the worker's: the engine runs a burst's rounds past one, and the worker
    drops their tokens. Every two-character stop string that ends on a token a burst sampled
    before its last round: the same text, usage and finish as without bursts, and the same
    prompt again, into the kept lane whose KV holds those dropped tokens, too."""
    probe, probe_conn, _ = worker_with(50)
    ticks = recorded(probe)
    submit(probe, probe_conn, "p", max_tokens=60)
    run(probe)
    text = probe_conn.text("p")
    ends, n = [], 0  # output positions (from 1) of tokens sampled in a burst's earlier rounds
    for _, result in ticks:
        earlier = result.earlier.get(0, [])
        ends += [n + i + 1 for i in range(len(earlier))]
        n += len(earlier) + (0 in result.sampled)
    stops = [text[e - 2 : e] for e in ends if e >= 2 and text.index(text[e - 2 : e]) == e - 2]
    assert len(stops) >= 3
    overran = 0
    for stop in stops:
        replies = {}
        for interval in (0, 50):
            worker, conn, _ = worker_with(interval)
            for job_id in ("a", "b"):  # b: the same prompt again, into a's kept lane
                request = {"endpoint": "completions", "prompt": "hello", "max_tokens": 60, "temperature": 0, "stop": [stop]}
                worker.handle(conn, Submit(job_id, request, qos=2))  # type: ignore[arg-type]
                run(worker)
            replies[interval] = [(conn.text(j), done(conn, j).usage, done(conn, j).finish_reason) for j in ("a", "b")]
            if interval:  # the burst ran past the stop string: tokens the reply never had
                overran += worker.engine.generated["a"] > done(conn, "a").usage["completion_tokens"]  # type: ignore[attr-defined]
        assert replies[50] == replies[0], stop
        assert replies[0][0][0] == text[: text.index(stop)] and replies[0][0][2] == "stop"
    assert overran >= 1


def test_an_arrival_ends_a_burst_before_its_next_round() -> None:
    worker, conn, _ = worker_with(1000, lanes=2)
    ticks = recorded(worker)
    submit(worker, conn, "a", max_tokens=1000)
    for _ in range(20):
        worker.run_tick()
    assert max(r.rounds for _, r in ticks) == MAX_BURST_ROUNDS
    engine: SimEngine = worker.engine  # type: ignore[assignment]
    start = len(engine.calls)

    def arrive(call: int) -> None:
        if call - start == 3:  # in the tick's third round, a background request comes
            request = {"endpoint": "completions", "prompt": "later", "max_tokens": 5, "temperature": 0}
            worker.inbox.put((conn, Submit("b", request, qos=3)))  # type: ignore[arg-type]

    engine.on_call = arrive
    worker.run_tick()
    plan, result = ticks[-1]
    assert plan.rounds == MAX_BURST_ROUNDS and result.rounds == 3  # stopped before its fourth round
    worker._take_messages(0.0)
    plan = worker.scheduler.step()
    assert any(b.job_id == "b" for b in plan.bind) and plan.rounds == 1


def scheduler_with(bursts: bool = True, max_batch: int = 2, **config: Any) -> Scheduler:
    sched = Scheduler(SchedulerConfig(max_batch=max_batch, lane_ctx=512, decode_bursts=bursts, **config), clock=FakeClock())
    sched.round_s = 0.01
    return sched


def decoding(sched: Scheduler, job: Job) -> None:
    """``job`` admitted, its prompt fed and its first token taken."""
    sched.add(job)
    plan = sched.step()
    lane = plan.feeds[0].lane
    sched.commit(TickResult(fed={lane: len(job.prompt)}, sampled={lane: 5}, elapsed_s=0.01))


def test_the_scheduler_bursts_only_where_nothing_could_happen_between_rounds() -> None:
    sched = scheduler_with()
    decoding(sched, Job("a", [1, 2, 3], max_tokens=100))
    assert sched.step().rounds == MAX_BURST_ROUNDS  # the worker ends it when text is due
    assert scheduler_with(False).step().rounds == 1  # no interval, no bursts
    for sampling in (SamplingParams(grammar="root ::= [a-z]+"), SamplingParams(logprobs=2)):
        sched = scheduler_with()
        decoding(sched, Job("a", [1, 2, 3], max_tokens=100, sampling=sampling))
        assert sched.step().rounds == 1  # the worker reads each token's mask or logprobs
    sched = scheduler_with()
    decoding(sched, Job("a", [1, 2, 3], max_tokens=100, batch_invariant=True))
    assert sched.step().rounds == 1
    sched = scheduler_with(tick_decode_budget=4)
    decoding(sched, Job("a", [1, 2, 3], max_tokens=100))
    assert sched.step().rounds == 1  # a decode budget rations rounds: the scheduler grants each
    # a job waiting (no lane for it, its class capped): the scheduler looks again each round
    sched = scheduler_with(max_batch=1)
    decoding(sched, Job("a", [1, 2, 3], max_tokens=100))
    sched.add(Job("b", [4, 5], max_tokens=5, qos=sched.jobs["a"].qos))
    assert sched.step().rounds == 1
    # a prompt being fed beside the decode round
    sched = scheduler_with()
    decoding(sched, Job("a", [1, 2, 3], max_tokens=100))
    sched.add(Job("b", list(range(50)), max_tokens=5))
    assert sched.step().rounds == 1
    # the last tokens of a job: no round past max_tokens
    sched = scheduler_with()
    decoding(sched, Job("a", [1, 2, 3], max_tokens=3))
    assert sched.step().rounds == 2
    sched = scheduler_with()  # nor past the lane's context (512 tokens)
    decoding(sched, Job("a", list(range(508)), max_tokens=100))
    assert sched.step().rounds == 3


def test_a_bursts_tokens_are_committed_in_order_and_its_time_counted_per_round() -> None:
    sched = scheduler_with()
    decoding(sched, Job("a", [1, 2, 3], max_tokens=100))
    plan = sched.step()
    lane = plan.feeds[0].lane
    events = sched.commit(TickResult(fed={lane: 4}, sampled={lane: 10}, earlier={lane: [6, 7, 8]}, rounds=4, elapsed_s=0.04))
    assert [(e.token, e.position) for e in events if e.kind == "token"] == [(6, 2), (7, 3), (8, 4), (10, 5)]
    assert sched.round_s == pytest.approx(0.01)  # a burst's time is per round
    job = sched.jobs["a"]
    assert job.output == [5, 6, 7, 8, 10] and job.computed == 7  # the last sampled token is fed next


@settings(max_examples=150, deadline=None)
@given(
    prompts=st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=12), min_size=1, max_size=3),
    together=st.booleans(),
    max_tokens=st.integers(1, 70),
    stops=st.lists(st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=3), max_size=3),
    eog=st.none() | st.integers(1, 70),
)
def test_any_replies_are_the_same_with_bursts_as_without(
    prompts: list[str], together: bool, max_tokens: int, stops: list[str], eog: int | None
) -> None:
    """Jobs at once (bursts over several lanes) or one after another (each into the lane the last
    one kept, whose KV holds what a burst ran past its stop string): each job's text, usage and
    finish are the same with bursts as with a plan every round."""
    replies = {}
    for interval in (0, 50):
        eog_after = {f"j{i}": eog for i in range(len(prompts))} if eog is not None else None
        worker, conn, _ = worker_with(interval, lanes=3, eog_after=eog_after)
        for i, prompt in enumerate(prompts):
            request = {"endpoint": "completions", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stop": stops}
            worker.handle(conn, Submit(f"j{i}", request, qos=2))  # type: ignore[arg-type]
            if not together:
                run(worker)
        run(worker)
        replies[interval] = [(conn.text(f"j{i}"), done(conn, f"j{i}").usage, done(conn, f"j{i}").finish_reason) for i in range(len(prompts))]
    assert replies[50] == replies[0]
