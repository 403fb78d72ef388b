"""--stream-interval-ms: a running job's text goes to its client at most this often, the tokens of
several short decode rounds in one Delta (one link message, one wake-up of the web process, one
SSE event), where each round's token went alone before. The first text goes at once (the time to
first token), a preemption at once, the end at once, and held text never waits behind a prompt
step or a drain's cut: the client sees the same text, in fewer and larger pieces."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management.base import CommandError

from scheduler.core.scheduler import SchedulerConfig
from scheduler.core.types import TickPlan, TickResult
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import SHUTDOWN, Delta, Done, Error, Message, Submit
from scheduler.management.options import engine_argv, scheduler_config
from scheduler.worker.loop import EngineWorker

from .test_worker_rules import parse, run

ROUND_S = 0.01  # a short decode round (SmolLM2 at one stream: ~8-11 ms)


class TimedConn:
    """The link connection, noting when (the worker's clock) each message was queued."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sent: list[tuple[float, Message]] = []

    def queue(self, message: Message) -> None:
        self.sent.append((self.clock(), message))

    def deltas(self, job_id: str) -> list[tuple[float, Delta]]:
        return [(t, m) for t, m in self.sent if isinstance(m, Delta) and m.id == job_id]

    def text(self, job_id: str) -> str:
        return "".join(m.text for _, m in self.deltas(job_id))


def worker_with(interval_ms: int, *, lanes: int = 2, park: bool = True, **engine_kw: Any) -> tuple[EngineWorker, TimedConn, FakeClock]:
    clock = FakeClock()
    engine = SimEngine(n_lanes=lanes, lane_ctx=1024, clock=clock, decode_round_s=ROUND_S, **engine_kw)
    config = SchedulerConfig(max_batch=lanes, lane_ctx=1024, park=park)
    worker = EngineWorker(engine, config, model_name="sim", clock=clock, stream_interval_ms=interval_ms)
    return worker, TimedConn(clock), clock


def submit(worker: EngineWorker, conn: TimedConn, job_id: str, *, prompt: str = "hello", max_tokens: int = 40, qos: int = 2) -> None:
    request = {"endpoint": "completions", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    worker.handle(conn, Submit(job_id, request, qos=qos))  # type: ignore[arg-type]


def test_a_stream_interval_sends_the_same_text_in_fewer_deltas_and_the_first_token_at_once() -> None:
    every, every_conn, _ = worker_with(0)
    paced, paced_conn, _ = worker_with(50)
    for worker, conn in ((every, every_conn), (paced, paced_conn)):
        submit(worker, conn, "a")
        run(worker)
    assert paced_conn.text("a") == every_conn.text("a") and len(every_conn.text("a")) > 0
    every_deltas, paced_deltas = every_conn.deltas("a"), paced_conn.deltas("a")
    assert len(every_deltas) >= 30  # a Delta a round
    assert len(paced_deltas) <= len(every_deltas) // 4  # ~5 rounds' tokens in each
    # the first text is not held: it leaves when it did without the interval
    assert paced_deltas[0][0] == every_deltas[0][0]
    assert paced_deltas[-1][1].tokens == every_deltas[-1][1].tokens == 40
    # no text waits much past the interval: one round at most
    times = [t for t, _ in paced_deltas]
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) <= 0.05 + ROUND_S + 1e-9
    done = [m for _, m in paced_conn.sent if isinstance(m, Done)]
    assert len(done) == 1 and paced_conn.sent[-1][1] is done[0]


def test_held_text_goes_out_before_a_prompt_step_not_after_it() -> None:
    """A running job's tokens held for the interval would wait for another job's whole prompt
    step (up to ~0.5 s) where each round's token went before it: they go before the step runs."""
    worker, conn, _clock = worker_with(1000, prefill_s_per_token=0.002)
    execute = worker.engine.execute
    held_at_prompt_steps: list[int] = []

    def watched(plan: TickPlan, should_stop: Any) -> TickResult:
        ctx = worker.contexts.get("chat")
        if plan.prefill_tokens and ctx is not None:
            held_at_prompt_steps.append(len(ctx.pending_text))
        return execute(plan, should_stop)

    worker.engine.execute = watched  # type: ignore[method-assign]
    submit(worker, conn, "chat", max_tokens=60)
    for _ in range(10):
        worker.run_tick()
    submit(worker, conn, "agent", prompt="word " * 100, max_tokens=5)
    run(worker)
    assert held_at_prompt_steps and held_at_prompt_steps == [0] * len(held_at_prompt_steps)
    # and the text held over the decode rounds before the step did wait (the interval is 1 s)
    assert len(conn.deltas("chat")) < 10


@pytest.mark.parametrize("park", [True, False])
def test_a_preemption_is_said_at_once_even_with_text_held(park: bool) -> None:
    """Parked (its KV saved: a step that may be long) or dropped (--no-park: recomputed later),
    a preempted job's client hears of it in the tick it happens, with all its text so far."""
    worker, conn, _clock = worker_with(1000, lanes=1, park=park)
    submit(worker, conn, "agent", max_tokens=200)
    for _ in range(10):
        worker.run_tick()
    job = worker.scheduler.jobs["agent"]
    assert len(conn.text("agent")) < len(job.output)  # text held
    submit(worker, conn, "chat", max_tokens=3, qos=0)
    worker.run_tick()
    assert job.preemptions == 1
    # the client is told at once, with all the text generated before it
    last = conn.deltas("agent")[-1][1]
    assert last.preemptions == 1 and last.tokens == len(job.output) == len(conn.text("agent"))


def test_a_drains_cut_sends_the_held_text_before_its_error() -> None:
    """A job still running when the drain's time is up ends with an error; the text it had
    generated, held for the interval, reaches the client first (in Redis mode the job goes on
    elsewhere after the tokens whose text went out)."""
    worker, conn, _clock = worker_with(1000)
    submit(worker, conn, "a", max_tokens=500)
    for _ in range(20):
        worker.run_tick()
    job = worker.scheduler.jobs["a"]
    assert len(job.output) > len(conn.text("a"))  # text held
    worker.drain()
    worker.run(drain_timeout_s=0.0)
    messages = [m for _, m in conn.sent if m.id == "a"]
    assert isinstance(messages[-1], Error) and messages[-1].reason == SHUTDOWN
    last = messages[-2]
    assert isinstance(last, Delta) and last.tokens == len(job.output) == len(conn.text("a"))


def test_the_flag_reaches_the_worker_and_its_bounds_are_checked() -> None:
    path = __import__("pathlib").Path("/m.gguf")
    options = parse(["--stream-interval-ms", "40"])
    assert parse(engine_argv(options, model=path)[2:])["stream_interval_ms"] == 40
    for bad in ("-1", "1001"):
        with pytest.raises(CommandError, match="--stream-interval-ms"):
            scheduler_config(parse(["--stream-interval-ms", bad]))


def test_held_text_of_all_jobs_goes_out_together_so_the_web_process_wakes_once_an_interval() -> None:
    """Four streams begun a round apart: paced each on its own, some stream's text would go out
    nearly every round (each its own wake-up of the web process); paced together, held text goes
    out once an interval, all four streams' in the same round."""
    worker, conn, _clock = worker_with(50, lanes=4)
    for n in range(4):
        submit(worker, conn, f"s{n}", max_tokens=60)
        worker.run_tick()
    run(worker)
    firsts = {m.id: t for t, m in reversed(conn.sent) if isinstance(m, Delta)}
    ends = {m.id: t for t, m in conn.sent if isinstance(m, Done)}
    # (after the last stream's first text: before it, the newcomers' prompt steps send what is held)
    started = max(firsts.values())
    held_out = sorted({t for t, m in conn.sent if isinstance(m, Delta) and started < t < ends[m.id]})
    assert len(held_out) > 5
    assert min(b - a for a, b in zip(held_out, held_out[1:], strict=False)) >= 0.05 - 1e-9
    assert all("".join(m.text for _, m in conn.deltas(f"s{n}")) for n in range(4))
