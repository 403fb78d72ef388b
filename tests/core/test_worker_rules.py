"""The worker's side of the seed's rules, on the simulated engine: fill-in-the-middle prompts,
OS pressure readings, the replan path, cache scopes and the --no-park switch."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management.base import CommandError

from scheduler.core.scheduler import SchedulerConfig
from scheduler.core.types import TickPlan, TickResult
from scheduler.engines.base import EngineError, Step, StepAborted
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import INVALID_PROMPT, Accepted, Cancel, Delta, Done, Error, Message, Rejected, Submit
from scheduler.management.options import add_engine_arguments, engine_argv, scheduler_config
from scheduler.worker import loop as loop_module
from scheduler.worker.loop import EngineWorker
from scheduler.worker.pressure import PressureMonitor, macos_level

PRE, SUF, MID = 250, 251, 252


class FimSim(SimEngine):
    vocab_size = 256

    def fim_tokens(self) -> tuple[int, int, int]:
        return PRE, SUF, MID


class FakeConn:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    def queue(self, message: Message) -> None:
        self.sent.append(message)


def make_worker(engine: SimEngine | None = None, **config: Any) -> tuple[EngineWorker, FakeConn]:
    clock = FakeClock()
    engine = engine or SimEngine(n_lanes=2, lane_ctx=512, clock=clock)
    engine.clock = clock
    worker = EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=512, **config), model_name="sim", clock=clock)
    return worker, FakeConn()


def submit(worker: EngineWorker, conn: FakeConn, job_id: str, request: dict[str, Any], **extra: Any) -> None:
    worker.handle(conn, Submit(id=job_id, request=request, qos=1, **extra))  # type: ignore[arg-type]


def run(worker: EngineWorker, ticks: int = 500) -> None:
    for _ in range(ticks):
        if not worker.run_tick() and worker.scheduler.idle:
            return


# -- fill-in-the-middle ------------------------------------------------------------------


def test_fim_with_a_token_array_prompt_keeps_the_prefix() -> None:
    worker, conn = make_worker(FimSim(n_lanes=2, lane_ctx=512))
    submit(worker, conn, "fim", {"endpoint": "completions", "prompt": [10, 11, 12], "suffix": "ab", "max_tokens": 2})
    assert worker.scheduler.jobs["fim"].prompt == [PRE, 10, 11, 12, SUF, 97, 98, MID]
    assert conn.sent[-1] == Accepted(id="fim", prompt_tokens=8)


def test_fim_with_a_text_prompt_and_one_out_of_vocabulary_token_array() -> None:
    worker, conn = make_worker(FimSim(n_lanes=2, lane_ctx=512))
    submit(worker, conn, "text", {"endpoint": "completions", "prompt": "xy", "suffix": "a", "max_tokens": 2})
    assert worker.scheduler.jobs["text"].prompt == [PRE, 120, 121, SUF, 97, MID]
    submit(worker, conn, "bad", {"endpoint": "completions", "prompt": [10, 999], "suffix": "a", "max_tokens": 2})
    last = conn.sent[-1]
    assert isinstance(last, Rejected) and last.reason == INVALID_PROMPT
    assert "bad" not in worker.scheduler.jobs


# -- cache scope -------------------------------------------------------------------------


def test_the_submit_payloads_cache_scope_reaches_the_job() -> None:
    worker, conn = make_worker()
    submit(worker, conn, "a", {"endpoint": "completions", "prompt": "hello", "max_tokens": 2}, cache_scope="policy:7")
    submit(worker, conn, "b", {"endpoint": "completions", "prompt": "hello", "max_tokens": 2})
    assert worker.scheduler.jobs["a"].cache_scope == "policy:7"
    assert worker.scheduler.jobs["b"].cache_scope == ""


# -- OS pressure readings ----------------------------------------------------------------


def test_pressure_monitor_reports_changes_once_a_second() -> None:
    readings = iter(["warning", "warning", "warning", "critical", None, None])
    monitor = PressureMonitor(read=lambda: next(readings))
    assert monitor.poll(0.0) == "warning"
    assert monitor.poll(0.5) is None  # between reads: no read at all
    assert monitor.poll(1.0) is None  # still warning: not a change
    assert monitor.poll(2.0) is None
    assert monitor.poll(3.0) == "critical"
    assert monitor.poll(4.0) == "normal"
    assert monitor.poll(5.0) is None


def test_pressure_monitor_is_silent_when_it_cannot_read() -> None:
    def broken() -> str | None:
        raise OSError("no PSI here")

    assert PressureMonitor(read=broken).poll(0.0) is None


def test_macos_pressure_levels() -> None:
    assert macos_level(1) is None
    assert macos_level(2) == "warning"
    assert macos_level(4) == "critical"


def test_a_warning_read_by_the_worker_evicts_once_while_it_lasts() -> None:
    worker, conn = make_worker()
    levels = iter(["warning"] * 5)
    worker.pressure = PressureMonitor(read=lambda: next(levels))
    for t in range(5):
        level = worker.pressure.poll(float(t))
        if level is not None:
            worker.scheduler.on_os_pressure(level)
        worker.run_tick()
    assert worker.scheduler.counters["os_pressure_warning"] == 1


# -- replan ------------------------------------------------------------------------------


class Refuses(SimEngine):
    """Refuses the next ``refuse`` plans that feed (the first, unless told otherwise): each runs
    its lane and cache work, then its first engine call fails with nothing fed (llama_decode
    returning 1)."""

    refuse = 1

    def execute(self, plan: TickPlan, should_stop: Any) -> TickResult:
        if plan.feeds and self.refuse:
            self.refuse -= 1
            feeds, plan.feeds = plan.feeds, []
            partial = super().execute(plan, should_stop)
            plan.feeds = feeds
            error = EngineError("llama_decode returned 1", permanent=False)
            error.partial = partial  # type: ignore[attr-defined]
            raise error
        return super().execute(plan, should_stop)


def test_a_refused_plan_is_replanned_with_pins_released_and_the_requests_still_finish() -> None:
    worker, conn = make_worker(Refuses(n_lanes=2, lane_ctx=512))
    submit(worker, conn, "a", {"endpoint": "completions", "prompt": "hello " * 10, "max_tokens": 3})
    run(worker)
    assert worker.scheduler.counters["plans_rejected"] == 1
    done = [m for m in conn.sent if isinstance(m, Done)]
    assert [m.id for m in done] == ["a"] and done[0].usage["completion_tokens"] == 3


def test_after_a_replan_that_failed_the_next_plan_refused_is_replanned_not_failed() -> None:
    """A plan refused, replanned and refused again fails its running job (engine_error). The
    replan mark stayed set after that failure, so the next plan, the queued job's first, was
    failed at its first refusal instead of being replanned: a second engine error, and a job
    that was only queued when the engine failed ended with it."""
    clock = FakeClock()
    engine = Refuses(n_lanes=1, lane_ctx=512, clock=clock)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=512), model_name="sim", clock=clock)
    conn = FakeConn()
    submit(worker, conn, "running", {"endpoint": "completions", "prompt": "hello", "max_tokens": 3})
    submit(worker, conn, "queued", {"endpoint": "completions", "prompt": "world", "max_tokens": 3})
    engine.refuse = 3  # "running": refused, replanned, refused again; then "queued": refused once
    run(worker)
    assert {m.id: m.reason for m in conn.sent if isinstance(m, Error)} == {"running": "engine_error"}
    done = [m for m in conn.sent if isinstance(m, Done)]
    assert [m.id for m in done] == ["queued"] and done[0].usage["completion_tokens"] == 3
    assert worker.stats["engine_errors_total"] == 1
    assert worker.scheduler.counters["plans_rejected"] == 2


# -- --no-park ---------------------------------------------------------------------------


def parse(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    return vars(parser.parse_args(argv))


def test_no_park_turns_parking_off_and_is_forwarded_to_the_worker() -> None:
    assert scheduler_config(parse([])).park is True
    options = parse(["--no-park"])
    assert scheduler_config(options).park is False
    argv = engine_argv(options, model=__import__("pathlib").Path("/m.gguf"))
    assert "--no-park" in argv and "--no-park" not in engine_argv(parse([]), model=__import__("pathlib").Path("/m.gguf"))
    assert parse(argv[2:])["no_park"] is True


def test_no_compact_lanes_reaches_the_worker_which_compacts_only_on_an_engine_that_asks() -> None:
    """serve --no-compact-lanes travels to runengine; the worker compacts when the config allows
    it and the engine declares that busy lanes in one run decode in one pass (llama.cpp)."""
    path = __import__("pathlib").Path("/m.gguf")
    options = parse(["--no-compact-lanes"])
    assert scheduler_config(parse([])).compact_lanes is True and scheduler_config(options).compact_lanes is False
    assert parse(engine_argv(options, model=path)[2:])["no_compact_lanes"] is True
    for asks, allowed, on in ((True, True, True), (True, False, False), (False, True, False)):
        engine = SimEngine(n_lanes=2, compact_lanes=asks)
        worker = EngineWorker(engine, SchedulerConfig(max_batch=2, compact_lanes=allowed), model_name="m")
        assert worker.scheduler.config.compact_lanes is on


class Abortable(SimEngine):
    """The simulator with llama.cpp's abort hooks, noting each call."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.calls: list[str] = []

    def abort_step(self) -> None:
        self.calls.append("abort")

    def clear_abort(self) -> None:
        self.calls.append("clear")


# (waiting, urgent): a background or agent arrival waits for the step; an interactive or a
# completion one aborts it (the completion class was untested here: only interactive was sent)
@pytest.mark.parametrize(("waiting_qos", "urgent_qos"), [(3, 0), (2, 1)])
def test_an_urgent_arrival_or_a_cancel_aborts_the_engine_step_and_the_next_tick_clears_it(waiting_qos: int, urgent_qos: int) -> None:
    engine = Abortable(n_lanes=2, lane_ctx=512)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=512), model_name="sim", prepare_in_thread=False)
    background = Submit("bg", {"endpoint": "completions", "prompt": "x", "max_tokens": 4}, qos=waiting_qos)
    worker._on_message(background)
    assert engine.calls == [] and not worker.interrupt.is_set()  # a batch or agent job waits for the step
    worker.handle(FakeConn(), background)  # type: ignore[arg-type]
    worker.run_tick()  # it takes a lane
    engine.calls.clear()  # (the simulator notes its steps there too)
    worker._on_message(Submit("chat", {"endpoint": "completions", "prompt": "x", "max_tokens": 4}, qos=urgent_qos))
    assert engine.calls == ["abort"] and worker.interrupt.is_set()
    worker._on_message(Cancel("bg"))
    assert engine.calls == ["abort", "abort"]
    worker.drain()
    worker.run(drain_timeout_s=0.0)  # each turn of the loop clears the flag before its tick
    assert engine.calls[2] == "clear" and not worker.interrupt.is_set()


class EstimatingAbortable(Abortable):
    """llama.cpp's hooks with the prompt step in flight: serial 7, expected to end in ``eta`` s
    (None: no step runs, or no rate is measured yet)."""

    def __init__(self, eta: float | None, **kw: Any) -> None:
        super().__init__(**kw)
        self.eta = eta

    def step_eta(self) -> tuple[int, float] | None:
        return None if self.eta is None else (7, self.eta)

    def abort_step(self, serial: int | None = None) -> None:  # type: ignore[override]
        self.calls.append("abort" if serial is None else f"abort step {serial}")


class HeldTimer:
    """threading.Timer that runs only when the test says so."""

    made: list[HeldTimer] = []

    def __init__(self, interval: float, function: Callable[..., None], kwargs: dict[str, Any]) -> None:
        self.interval, self.function, self.kwargs, self.daemon = interval, function, kwargs, False
        HeldTimer.made.append(self)

    def start(self) -> None:
        pass

    def fire(self) -> None:
        self.function(**self.kwargs)


@pytest.mark.parametrize(
    ("eta", "grace_s", "message", "at_once"),
    [
        (0.1, 0.3, "chat", False),  # ends within the grace: runs on
        (-0.05, 0.3, "chat", False),  # late on its estimate: the timer aborts it soon
        (0.28, 0.3, "chat", False),  # the grace bounds the wait
        (0.5, 0.3, "chat", True),  # too long to wait for
        (None, 0.3, "chat", True),  # no estimate
        (0.1, 0.0, "chat", True),  # --abort-grace-ms 0
        (0.1, 0.3, "cancel", True),  # a cancel never waits
    ],
)
def test_an_urgent_arrival_lets_a_prompt_step_about_to_end_run_on_and_aborts_it_past_the_grace(
    monkeypatch: pytest.MonkeyPatch, eta: float | None, grace_s: float, message: str, at_once: bool
) -> None:
    """A chat arriving 0.1 s before the end of a 1.7 s prompt step would save 0.1 s by aborting it
    and throw 1.6 s of the agents' work away: the step runs on (a timer aborts it still if it runs
    past the grace). A longer remainder, no estimate, no grace, or a cancel: aborted at once."""
    HeldTimer.made = []
    monkeypatch.setattr(loop_module.threading, "Timer", HeldTimer)
    engine = EstimatingAbortable(eta, n_lanes=2, lane_ctx=512)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=512, abort_grace_s=grace_s), model_name="sim")
    if message == "cancel":  # of a job in a lane
        worker.handle(FakeConn(), Submit("bg", {"endpoint": "completions", "prompt": "x", "max_tokens": 4}, qos=3))  # type: ignore[arg-type]
        worker.run_tick()
        engine.calls.clear()  # (the simulator notes its steps there too)
    chat = Submit("chat", {"endpoint": "completions", "prompt": "x", "max_tokens": 4}, qos=0)
    worker._on_message(chat if message == "chat" else Cancel("bg"))
    assert worker.interrupt.is_set()  # the tick stops after this step either way
    if at_once:
        assert engine.calls == ["abort"] and HeldTimer.made == []
        return
    assert engine.calls == []
    worker._on_message(Submit("chat2", {"endpoint": "completions", "prompt": "x", "max_tokens": 4}, qos=1))
    # one timer for the step, whoever arrives: at its estimated end and a little, at most the grace
    assert [t.interval for t in HeldTimer.made] == [pytest.approx(min(grace_s, max(0.0, eta or 0.0) + loop_module.ABORT_OVERRUN_S))]
    HeldTimer.made[0].fire()
    assert engine.calls == ["abort step 7"]  # that step only, if it still runs


def test_a_cancel_of_a_job_without_a_lane_lets_the_prompt_step_in_flight_run_on() -> None:
    """A cancel aborts the prompt step in flight so that the cancelled job's lane is released
    at once. One of a job that holds no lane (queued, being prepared, unknown) aborted it too,
    freeing nothing: on a loaded worker whose queued clients give up now and then, a long prompt
    was thrown away step after step and never got prefilled. A cancel of a running job still
    aborts the step."""
    clock = FakeClock()
    engine = AbortingSim(n_lanes=1, lane_ctx=4096, clock=clock, prefill_s_per_token=1 / 300, decode_round_s=0.02)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=4096), model_name="sim", clock=clock)
    conn = FakeConn()

    def deliver(message: Message) -> None:
        worker._on_message(message)
        worker.inbox.put((conn, message))  # type: ignore[arg-type]

    deliver(Submit("long", {"endpoint": "completions", "prompt": "x" * 3000, "max_tokens": 4}, qos=3))
    gave_up = iter(range(1000))

    def a_queued_client_gives_up(step: Step) -> None:
        if step.prefill:  # during each of the long prompt's 512-token steps (1.7 s)
            job_id = f"queued{next(gave_up)}"
            deliver(Submit(job_id, {"endpoint": "completions", "prompt": "hi", "max_tokens": 4}, qos=3))
            deliver(Cancel(job_id))

    engine.during_step = a_queued_client_gives_up
    serve_turns(worker, lambda: any(isinstance(m, Done) and m.id == "long" for m in conn.sent), turns=200)
    assert engine.aborted == []
    assert {m.id for m in conn.sent if isinstance(m, Done) and m.finish_reason == "cancelled"} >= {"queued0", "queued1"}
    # a running job's cancel: aborted at once
    deliver(Submit("next", {"endpoint": "completions", "prompt": "y" * 3000, "max_tokens": 4}, qos=3))
    engine.during_step = lambda step: deliver(Cancel("next")) if step.prefill and not engine.aborted else None
    serve_turns(worker, lambda: any(isinstance(m, Done) and m.id == "next" for m in conn.sent), turns=200)
    assert engine.aborted == [512]


def test_abort_grace_ms_reaches_the_worker_and_bad_values_are_refused() -> None:
    assert scheduler_config(parse([])).abort_grace_s == 0.3
    options = parse(["--abort-grace-ms", "0"])
    assert scheduler_config(options).abort_grace_s == 0.0
    assert parse(engine_argv(options, model=__import__("pathlib").Path("/m.gguf"))[2:])["abort_grace_ms"] == 0
    for bad in ("-1", "10001"):
        with pytest.raises(CommandError, match="--abort-grace-ms"):
            scheduler_config(parse(["--abort-grace-ms", bad]))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--aging-divisor", "nan"], "--aging-divisor must be 0 (off) or a positive number; got nan"),
        (["--swap-affinity-bonus", "100"], "--swap-affinity-bonus must be between 0 and 99; got 100"),
        (["--tick-target-ms", "0"], "--tick-target-ms must be at least 1; got 0"),
        (["--prefill-budget", "5"], "--prefill-budget must be 0 (adaptive) or between 64 and 4096; got 5"),
        (["--tick-decode-budget", "-1"], "--tick-decode-budget must be 0 (every decoding lane) or positive; got -1"),
    ],
)
def test_a_bad_scheduling_flag_is_refused_in_the_flags_own_words(argv: list[str], message: str) -> None:
    """The scheduler's own checks named its fields ("aging_divisor_s must be ..."): an operator
    who wrote --aging-divisor looked for a setting of another name."""
    with pytest.raises(CommandError) as err:
        scheduler_config(parse(argv))
    assert str(err.value) == message


class AbortingSim(SimEngine):
    """The simulator with llama.cpp's abortable steps: a step that carries prompt tokens stops
    (a few ms in, charged to the clock) and is rolled back while the abort flag is set.
    ``during_step`` runs as each step starts, for what arrives while it runs."""

    abortable = True

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.flag = False
        self.aborted: list[int] = []  # tokens of each aborted step
        self.during_step: Callable[[Step], None] | None = None

    def abort_step(self) -> None:
        self.flag = True

    def clear_abort(self) -> None:
        self.flag = False

    def forward(self, step: Step) -> dict[int, int]:
        if self.during_step is not None:
            self.during_step(step)
        if self.flag and step.prefill:
            self.clock.advance(0.005)
            self.aborted.append(sum(len(p.tokens) for p in step.pieces))
            raise StepAborted("step aborted")
        return super().forward(step)


class TimedConn(FakeConn):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.first_delta: dict[str, float] = {}

    def queue(self, message: Message) -> None:
        if isinstance(message, Delta):
            self.first_delta.setdefault(message.id, self.clock())
        super().queue(message)


def serve_turns(worker: EngineWorker, until: Callable[[], bool], turns: int = 2000) -> None:
    """The serving loop's turns (``EngineWorker.run``): clear the flags, take what arrived, run a
    tick. Waits for the preparation thread, as a short prompt is prepared in milliseconds."""
    for _ in range(turns):
        if until():
            return
        worker.interrupt.clear()
        worker.engine.clear_abort()  # type: ignore[attr-defined]
        worker._drain_inbox(0.0)
        deadline = time.monotonic() + 5.0
        while worker.preparing and time.monotonic() < deadline:
            worker._drain_inbox(0.05)
        worker.run_tick()
    raise AssertionError("the worker did not get there")


def agents_then_a_chat(chat: bool) -> tuple[EngineWorker, AbortingSim, TimedConn, float]:
    """Two background agents on a two-lane worker that prepares prompts on its own thread, as the
    server's does: one decodes while the other's 3000-token prompt prefills in 512-token steps
    (300 tok/s, 1.7 s a step). If ``chat``, an interactive chat arrives while such a step runs,
    delivered as the link's reader thread delivers it. Returns the arrival time too."""
    clock = FakeClock()
    engine = AbortingSim(n_lanes=2, lane_ctx=4096, clock=clock, prefill_s_per_token=1 / 300, decode_round_s=0.02)
    worker = EngineWorker(
        engine, SchedulerConfig(max_batch=2, lane_ctx=4096), model_name="sim", clock=clock, prepare_in_thread=True
    )
    conn = TimedConn(clock)

    def deliver(message: Message) -> None:
        worker._on_message(message)
        worker.inbox.put((conn, message))  # type: ignore[arg-type]

    done = lambda *ids: lambda: {m.id for m in conn.sent if isinstance(m, Done)} >= set(ids)  # noqa: E731
    deliver(Submit("talker", {"endpoint": "completions", "prompt": "hi", "max_tokens": 40}, qos=3))
    serve_turns(worker, lambda: "talker" in conn.first_delta)
    deliver(Submit("long", {"endpoint": "completions", "prompt": "x" * 3000, "max_tokens": 4}, qos=3))
    arrived: list[float] = []

    def chat_arrives(step: Step) -> None:
        if chat and not arrived and step.prefill and sum(len(p.tokens) for p in step.pieces) == 512:
            arrived.append(clock())
            deliver(Submit("chat", {"endpoint": "completions", "prompt": "hello", "max_tokens": 3}, qos=0))

    engine.during_step = chat_arrives
    serve_turns(worker, done("talker", "long", "chat") if chat else done("talker", "long"))
    return worker, engine, conn, arrived[0] if arrived else 0.0


def test_an_urgent_arrival_aborts_a_big_prefill_step_gets_its_first_token_at_once_and_the_step_is_redone() -> None:
    worker, engine, conn, arrived = agents_then_a_chat(chat=True)
    assert worker.scheduler.config.abortable_steps  # the engine said its steps abort: full chunks
    assert engine.aborted and engine.aborted[0] == 512  # the step in flight was stopped
    # The chat's first token: the abort (ms), then its own tick beside the decode round, not
    # after the 1.7 s step it arrived during.
    assert conn.first_delta["chat"] - arrived < 0.1
    # The aborted prompt chunk ran again later: both agents finish exactly as undisturbed.
    _, _, quiet, _ = agents_then_a_chat(chat=False)

    def texts(c: FakeConn) -> dict[str, str]:
        out: dict[str, str] = {}
        for m in c.sent:
            if isinstance(m, Delta):
                out[m.id] = out.get(m.id, "") + m.text
        return out

    def usage(c: FakeConn) -> dict[str, dict[str, int]]:
        return {m.id: m.usage for m in c.sent if isinstance(m, Done)}

    assert {k: v for k, v in texts(conn).items() if k != "chat"} == texts(quiet)
    assert usage(conn)["long"] == usage(quiet)["long"]
    assert usage(conn)["chat"]["completion_tokens"] == 3


def test_an_urgent_job_is_prepared_before_the_agents_prompts_handed_over_with_it() -> None:
    """The tick thread hands Submits to the prepare thread between ticks, so a chat that arrives
    during a long prompt step is handed over together with the agents' Submits that came in
    before it. The prepare thread takes the chat next, after the prompt it is working on: in
    arrival order it would wait for every one of them (a 1,000-token prompt each, rendered and
    tokenised), and the tick thread's wait for it would run out."""
    clock = FakeClock()
    engine = SimEngine(n_lanes=8, lane_ctx=4096, clock=clock)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=8, lane_ctx=4096), model_name="sim", clock=clock, prepare_in_thread=True)
    conn = FakeConn()
    working, release = threading.Event(), threading.Event()
    order: list[str] = []
    build = worker._build

    def gated_build(c: Any, message: Submit) -> Any:
        order.append(message.id)
        if message.id == "agent0":  # holds the prepare thread until every Submit is handed over
            working.set()
            release.wait(10)
        return build(c, message)

    worker._build = gated_build  # type: ignore[method-assign]
    agent = {"endpoint": "completions", "prompt": "x" * 1000, "max_tokens": 4}
    worker.handle(conn, Submit("agent0", agent, qos=2))  # type: ignore[arg-type]
    assert working.wait(10)
    for i in range(1, 5):
        worker.handle(conn, Submit(f"agent{i}", agent, qos=2))  # type: ignore[arg-type]
    worker.handle(conn, Submit("chat", {"endpoint": "completions", "prompt": "hello", "max_tokens": 3}, qos=0))  # type: ignore[arg-type]
    release.set()
    prepared = [worker.inbox.get(timeout=10)[1] for _ in range(6)]
    assert order == ["agent0", "chat", "agent1", "agent2", "agent3", "agent4"]
    assert [m.id for m in prepared] == order  # type: ignore[attr-defined]


def test_an_urgent_job_refused_once_prepared_stops_the_tick_after_its_step_without_aborting_it() -> None:
    """Once an interactive or completion job is prepared, the prepare thread stops the tick in
    flight and aborts its prompt step, so that the job starts at once. A job refused there (a
    prompt over the context, found by tokenising it) starts nothing: aborting the step threw its
    prompt work away for no one. Its refusal still goes out after the step in flight."""
    engine = Abortable(n_lanes=2, lane_ctx=64)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=64), model_name="sim", prepare_in_thread=True)
    conn = FakeConn()
    worker.handle(conn, Submit("long", {"endpoint": "completions", "prompt": "x" * 100, "max_tokens": 3}, qos=0))  # type: ignore[arg-type]
    _, refused = worker.inbox.get(timeout=10)
    assert refused.refusal is not None and refused.refusal.reason == "context_length_exceeded"  # type: ignore[attr-defined]
    assert engine.calls == [] and worker.interrupt.is_set()
    worker.interrupt.clear()
    worker.handle(conn, Submit("fits", {"endpoint": "completions", "prompt": "x" * 10, "max_tokens": 3}, qos=0))  # type: ignore[arg-type]
    _, prepared = worker.inbox.get(timeout=10)
    assert prepared.built is not None  # type: ignore[attr-defined]
    assert engine.calls == ["abort"] and worker.interrupt.is_set()


def test_no_step_begins_while_an_urgent_job_is_being_prepared_so_none_is_begun_only_to_be_aborted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The serving loop itself (``EngineWorker.run``): a chat arrives during an agent's 512-token
    prompt step and stops it; its preparation then takes 30 ms on the prepare thread. A step
    begun in those 30 ms would be aborted as soon as the chat is ready, its work lost: the loop
    begins none, then serves the chat and finishes the agent. (The wait's cap, 0.1 s, is raised
    here so that a loaded machine's slow thread switch cannot end the wait early.)"""
    monkeypatch.setattr(loop_module, "URGENT_PREPARE_HOLD_S", 10.0)
    clock = FakeClock()
    engine = AbortingSim(n_lanes=2, lane_ctx=4096, clock=clock, prefill_s_per_token=1 / 300, decode_round_s=0.02)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=4096), model_name="sim", clock=clock, prepare_in_thread=True)
    conn = FakeConn()
    build = worker._build

    def slow_build(c: Any, message: Submit) -> Any:
        if message.id == "chat":
            time.sleep(0.03)
        return build(c, message)

    worker._build = slow_build  # type: ignore[method-assign]

    def deliver(message: Message) -> None:
        worker._on_message(message)
        worker.inbox.put((conn, message))  # type: ignore[arg-type]

    begun_while_preparing: list[int] = []

    def during(step: Step) -> None:
        if "chat" in worker.preparing:
            begun_while_preparing.append(sum(len(p.tokens) for p in step.pieces))
        elif step.prefill and not engine.aborted and not any(m.id == "chat" for m in conn.sent):
            deliver(Submit("chat", {"endpoint": "completions", "prompt": "hello", "max_tokens": 3}, qos=0))

    engine.during_step = during
    deliver(Submit("long", {"endpoint": "completions", "prompt": "x" * 3000, "max_tokens": 4}, qos=3))
    loop = threading.Thread(target=worker.run, kwargs={"drain_timeout_s": 30.0}, daemon=True)
    loop.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not {"long", "chat"} <= {m.id for m in conn.sent if isinstance(m, Done)}:
        time.sleep(0.01)
    worker.drain()
    loop.join(20)
    assert not loop.is_alive()
    assert engine.aborted == [512]  # the step the chat arrived in, and no other
    assert begun_while_preparing == []
    assert {m.id for m in conn.sent if isinstance(m, Done)} == {"long", "chat"}


@pytest.mark.parametrize("max_tokens", [3, 5])
def test_a_stop_string_completed_by_the_last_allowed_token_finishes_with_stop(max_tokens: int) -> None:
    """OpenAI's finish_reason is "stop" whenever a stop sequence ended the text; it was "length"
    when the stop string's last character came with the max_tokens-th token."""
    worker, conn = make_worker()
    submit(worker, conn, "free", {"endpoint": "completions", "prompt": "hello", "max_tokens": 3})
    run(worker)
    text = "".join(m.text for m in conn.sent if isinstance(m, Delta))
    worker, conn = make_worker()
    submit(worker, conn, "stopped", {"endpoint": "completions", "prompt": "hello", "max_tokens": max_tokens, "stop": [text[1:3]]})
    run(worker)
    assert "".join(m.text for m in conn.sent if isinstance(m, Delta)) == text[:1]
    assert [m.finish_reason for m in conn.sent if isinstance(m, Done)] == ["stop"]


def test_a_deadline_that_expires_in_a_tick_whose_engine_step_fails_still_reaches_its_client() -> None:
    """A queued completion's start deadline expires as the tick is planned and the engine then
    fails: the running job gets its engine error and the queued one its deadline_exceeded. The
    failure used to drop every pending event, so that client waited forever, its job held."""
    from scheduler.link.messages import DEADLINE_EXCEEDED, ENGINE_ERROR, Error

    clock = FakeClock()

    class FailsOnce(SimEngine):
        fail = False

        def execute(self, plan: TickPlan, should_stop: Any) -> TickResult:
            if self.fail:
                self.fail = False
                raise EngineError("a KV restore failed")  # nothing ran: no partial result
            return super().execute(plan, should_stop)

    engine = FailsOnce(n_lanes=1, lane_ctx=512, clock=clock)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=512), model_name="sim", clock=clock, completion_deadline_ms=500)
    conn = FakeConn()
    worker.handle(conn, Submit(id="running", request={"endpoint": "completions", "prompt": "hello", "max_tokens": 200}, qos=1))
    worker.run_tick()
    worker.run_tick()
    worker.handle(conn, Submit(id="queued", request={"endpoint": "completions", "prompt": "world", "max_tokens": 5}, qos=1))
    clock.advance(1.0)
    engine.fail = True
    for _ in range(20):
        worker.run_tick()
    ends = {m.id: m.reason for m in conn.sent if isinstance(m, Error)}
    assert ends == {"running": ENGINE_ERROR, "queued": DEADLINE_EXCEEDED}
    assert worker.contexts == {} and worker.scheduler.idle


def test_tokens_sampled_before_a_refused_step_keep_their_logprobs() -> None:
    """A plan the engine refuses part way is committed as far as it ran; the tokens sampled in
    it went out with null logprobs (the replan path did not queue them)."""

    class ScoresAndRefusesOnce(SimEngine):
        refused = False

        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            self.features = frozenset({"logprobs"})
            self._sampled: list[int] = []

        def forward(self, step: Step) -> dict[int, int]:
            sampled = super().forward(step)
            self._sampled = list(sampled)
            return sampled

        def take_logprobs(self) -> dict[int, tuple[float, list[tuple[int, float]]]]:
            return {lane: (-0.25, [(7, -0.25)]) for lane in self._sampled}

        def execute(self, plan: TickPlan, should_stop: Any) -> TickResult:
            result = super().execute(plan, should_stop)
            if plan.feeds and not self.refused:  # as if a later step of this tick was refused
                self.refused = True
                error = EngineError("llama_decode returned 1", permanent=False)
                error.partial = result
                raise error
            return result

    worker, conn = make_worker(ScoresAndRefusesOnce(n_lanes=2, lane_ctx=512))
    submit(worker, conn, "a", {"endpoint": "completions", "prompt": "hello", "max_tokens": 3, "logprobs": 1})
    run(worker)
    assert worker.scheduler.counters["plans_rejected"] == 1
    entries = [e for m in conn.sent if isinstance(m, Delta) for e in (m.logprobs or [])]
    assert len(entries) == 3 and all(e["logprob"] == -0.25 for e in entries), entries


@pytest.mark.parametrize(("field", "value"), [("priority", None), ("priority", "high"), ("priority", float("nan")), ("stop", [1, 2]), ("stop", 3)])
def test_a_malformed_submit_is_refused_and_the_worker_goes_on(field: str, value: Any) -> None:
    """A priority int() cannot read raised out of handle(), ending the worker's loop; a stop
    list holding a non-string was accepted and raised in the tick. Only a peer of another
    version sends these (the web side validates both), but no Submit may take the worker down."""
    from scheduler.link.messages import Rejected

    worker, conn = make_worker()
    request: dict[str, Any] = {"endpoint": "completions", "prompt": "hello", "max_tokens": 3}
    extra: dict[str, Any] = {}
    if field == "stop":
        request["stop"] = value
    else:
        extra["priority"] = value
    worker.handle(conn, Submit(id="bad", request=request, qos=2, **extra))  # type: ignore[arg-type]
    assert [type(m) for m in conn.sent] == [Rejected]
    submit(worker, conn, "good", {"endpoint": "completions", "prompt": "hello", "max_tokens": 3})
    run(worker)
    assert [m.id for m in conn.sent if isinstance(m, Done)] == ["good"]


def test_a_lane_copied_from_is_not_preempted_in_the_same_plan() -> None:
    """An interactive job preempting a background lane copies its shared prefix from an agent's
    lane; a completion job then preempted that agent in the same plan, and the tick parked the
    lane before the copy ran: the interactive job decoded after KV that was not there (the
    simulated engine refuses the copy). A worker-loop fuzzer found it."""
    worker, conn = make_worker(min_prefix_tokens=8)
    shared = "the shared system prompt, long enough "

    def send(job_id: str, prompt: str, qos: int) -> None:
        worker.handle(conn, Submit(id=job_id, request={"endpoint": "completions", "prompt": prompt, "max_tokens": 40}, qos=qos))  # type: ignore[arg-type]

    send("A", "an unrelated background prompt", 3)
    send("L", shared + "leader", 2)
    for _ in range(3):
        worker.run_tick()
    send("U1", shared + "first urgent", 0)  # preempts A, copies the shared prefix from L's lane
    send("U2", "another urgent one", 1)  # would preempt L in the same plan
    run(worker)
    assert {m.id for m in conn.sent if isinstance(m, Done)} == {"A", "L", "U1", "U2"}


class FailsBeforeAnyStep(SimEngine):
    """Fails the next plan before running any of it (EngineError with no partial result)."""

    fail_next = False

    def execute(self, plan: TickPlan, should_stop: Any) -> TickResult:
        if self.fail_next:
            self.fail_next = False
            raise EngineError("a KV restore failed")
        return super().execute(plan, should_stop)


def test_after_a_tick_that_failed_before_its_lane_and_cache_work_no_job_finds_stale_kv() -> None:
    """The failed plan held a finished job's lane release and a pinned prompt's store; step() had
    used both up and nothing issued them again: the next job on the lane fed after the old job's
    KV, and a later job sharing the pinned prompt copied it from a slot never filled (the
    simulated engine refuses both). A worker-loop fuzzer found it."""
    engine = FailsBeforeAnyStep(n_lanes=2, lane_ctx=512, cache_slots=2)
    worker, conn = make_worker(engine, cache_slots=2, min_prefix_tokens=8)
    shared = "a system prompt that is pinned in the cache "
    submit(worker, conn, "first", {"endpoint": "completions", "prompt": "first job", "max_tokens": 3})
    run(worker)
    submit(worker, conn, "pinned", {"endpoint": "completions", "prompt": shared + "one", "max_tokens": 30}, pin_prefix=True)
    worker.run_tick()  # its prompt prefilled: the next plan stores it
    engine.fail_next = True
    worker.run_tick()
    for job_id, prompt in (("next", "second job"), ("sharer", shared + "two"), ("third", "third job")):
        submit(worker, conn, job_id, {"endpoint": "completions", "prompt": prompt, "max_tokens": 3})
        run(worker)
    done = {m.id for m in conn.sent if isinstance(m, Done)}
    assert done == {"first", "next", "sharer", "third"}


def test_a_job_submitted_again_after_its_link_dropped_is_served_on_the_new_connection() -> None:
    """After a link drop the web side reconnects and submits each job in flight again, same id,
    with the text delivered. (1) With the Disconnected and the resubmission in one inbox drain,
    the old job's context was still there: Rejected(duplicate_id). (2) With preparation on its
    thread and the old Submit still queued there, the thread prepared the old message for the
    dead connection: the new one got Accepted, then nothing. A worker-loop fuzzer found both."""
    import threading

    from scheduler.worker.server import Disconnected

    request = {"endpoint": "completions", "prompt": "hello there", "max_tokens": 20}
    # (1) one inbox drain
    worker, old = make_worker()
    submit(worker, old, "a", request)
    for _ in range(4):
        worker.run_tick()
    delivered = "".join(m.text for m in old.sent if isinstance(m, Delta))
    new = FakeConn()
    worker.handle(old, Disconnected())
    submit(worker, new, "a", request, resume_text=delivered, resume_tokens=len(delivered))
    run(worker)
    assert [type(m) for m in new.sent][:1] == [Accepted] and isinstance(new.sent[-1], Done), new.sent
    assert worker.stats["requests_total"] == 1  # one request, not two (it was counted again)
    # (2) the old Submit still queued on the preparation thread
    clock = FakeClock()
    worker = EngineWorker(SimEngine(n_lanes=2, lane_ctx=512, clock=clock), SchedulerConfig(max_batch=2, lane_ctx=512), model_name="sim", clock=clock, prepare_in_thread=True)
    held, build = threading.Event(), worker._build

    def slow_build(conn: Any, message: Submit) -> Any:
        if message.id == "blocker":
            held.wait(10)
        return build(conn, message)

    worker._build = slow_build  # type: ignore[method-assign]
    old, new = FakeConn(), FakeConn()
    submit(worker, old, "blocker", request)
    submit(worker, old, "b", request)  # queued behind the blocker
    worker.handle(old, Disconnected())
    submit(worker, new, "b", request, resume_text="xy", resume_tokens=2)
    held.set()
    deadline = time.monotonic() + 30
    while not any(isinstance(m, Done) for m in new.sent):
        assert time.monotonic() < deadline, new.sent
        worker._drain_inbox(0.05)
        worker.run_tick()
    assert not any(isinstance(m, (Delta, Done)) and m.id == "b" for m in old.sent)


def test_a_long_job_submitted_again_after_a_link_drop_counts_once_however_many_jobs_came_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ids counted in requests_total are remembered for the latest COUNTED_IDS jobs. A job
    that ran while more jobs than that were admitted after it (a long agent beside many short
    chats) was forgotten while it still ran: its resubmission after a link drop counted it again."""
    from scheduler.worker.server import Disconnected

    monkeypatch.setattr(loop_module, "COUNTED_IDS", 4)
    worker, old = make_worker()
    request = {"endpoint": "completions", "prompt": "hello there", "max_tokens": 200}
    submit(worker, old, "long", request)
    for i in range(6):  # more short jobs than COUNTED_IDS, admitted and finished while it runs
        submit(worker, old, f"short{i}", {"endpoint": "completions", "prompt": "hi", "max_tokens": 1})
        for _ in range(5):
            worker.run_tick()
    assert "long" in worker.contexts and worker.stats["requests_total"] == 7
    delivered = "".join(m.text for m in old.sent if isinstance(m, Delta) and m.id == "long")
    worker.handle(old, Disconnected())  # type: ignore[arg-type]
    new = FakeConn()
    submit(worker, new, "long", request, resume_text=delivered, resume_tokens=len(delivered))
    run(worker)
    assert isinstance(new.sent[-1], Done) and new.sent[-1].id == "long"
    assert worker.stats["requests_total"] == 7  # one request, counted once


class FailsLane(SimEngine):
    """take_failed names every lane sampled in the step that brings the samples to ``at``."""

    def __init__(self, at: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.at, self.samples = at, 0
        self.failing: dict[int, str] = {}

    def forward(self, step: Step) -> dict[int, int]:
        sampled = super().forward(step)
        before, self.samples = self.samples, self.samples + len(sampled)
        if before < self.at <= self.samples:
            self.failing = {lane: "the grammar took too long" for lane in sampled}
        return sampled

    def take_failed(self) -> dict[int, str]:
        taken, self.failing = self.failing, {}
        return taken


def test_a_lane_the_engine_fails_ends_its_job_with_an_error_after_the_tokens_it_sampled() -> None:
    """An engine that names a lane whose job must end (llama.cpp: a grammar too slow to mask)
    ends that job alone, after the tick's token reached its client; a job that the same tick
    finishes (its last allowed token) keeps its Done."""
    from scheduler.link.messages import GRAMMAR_TOO_SLOW

    worker, conn = make_worker(FailsLane(3, n_lanes=2, lane_ctx=512))
    submit(worker, conn, "a", {"endpoint": "completions", "prompt": "hi", "max_tokens": 6, "temperature": 0})
    run(worker)
    ends = [m for m in conn.sent if isinstance(m, (Done, Error))]
    text = "".join(m.text for m in conn.sent if isinstance(m, Delta) and m.id == "a")
    assert [(type(m).__name__, getattr(m, "reason", None)) for m in ends] == [("Error", GRAMMAR_TOO_SLOW)]
    assert len(text) == 3 and worker.scheduler.idle and not worker.contexts  # its third token went out first
    worker, conn = make_worker(FailsLane(3, n_lanes=2, lane_ctx=512))
    submit(worker, conn, "b", {"endpoint": "completions", "prompt": "hi", "max_tokens": 3, "temperature": 0})
    run(worker)
    ends = [m for m in conn.sent if isinstance(m, (Done, Error))]
    assert len(ends) == 1 and isinstance(ends[0], Done) and ends[0].finish_reason == "length"


# -- constraints an engine's parser cannot survive -----------------------------------------

NESTED = 30_000  # llama.cpp's GBNF parser recurses per group: ~20,000 crashed the worker (SIGSEGV)
DEEP: dict[str, Any] = {"type": "string"}
for _ in range(400):  # deeper than the converter's recursion takes (the limit, not the body, refuses it)
    DEEP = {"type": "object", "properties": {"x": DEEP}}


@pytest.mark.parametrize(
    ("constraint", "param"),
    [
        ({"response_format": {"type": "json_schema", "schema": {"type": "string", "maxLength": 20_000}}}, "response_format"),
        ({"response_format": {"type": "json_schema", "schema": {"type": "string", "minLength": 30_000_000}}}, "response_format"),
        ({"response_format": {"type": "json_schema", "schema": {"type": "string", "pattern": "^a{0,50000}$"}}}, "response_format"),
        ({"response_format": {"type": "json_schema", "schema": {"type": "array", "items": {"type": "integer"}, "maxItems": 100_000}}}, "response_format"),
        ({"response_format": {"type": "grammar", "grammar": "root ::= " + "(" * NESTED + '"a"' + ")" * NESTED}}, "response_format"),
        ({"response_format": {"type": "grammar", "grammar": 'root ::= "a"{0,99999999999999999999}'}}, "response_format"),
        ({"response_format": {"type": "grammar", "grammar": 'root ::= "' + "a" * (2 << 20) + '"'}}, "response_format"),
        ({"tools": [{"name": "f", "parameters": {"type": "object", "properties": {"s": {"type": "string", "maxLength": 20_000}}}}],
          "tool_choice": "required"}, "tools"),  # the tools' parameters, not the choice
        # beside tools (tool_choice auto) a schema too deep for the converter was a 500
        ({"tools": [{"name": "f", "parameters": {"type": "object"}}], "tool_choice": "auto",
          "response_format": {"type": "json_schema", "schema": DEEP}}, "response_format"),
    ],
    ids=["maxLength", "minLength", "pattern", "maxItems", "nested-groups", "huge-repeat", "huge-grammar", "tool-parameters", "deep-beside-tools"],
)
def test_a_constraint_that_would_crash_or_swamp_the_engine_is_a_400_and_the_worker_goes_on(constraint: dict[str, Any], param: str) -> None:
    """Tiny bodies that made llama.cpp's parser crash the worker (a maxLength of 20,000 became
    20,000 nested groups; the restarted worker got the same request and crashed again) or made
    a 150 MB grammar (minLength 30,000,000) are refused before any engine parses them."""
    worker, conn = make_worker()
    submit(worker, conn, "bad", {"endpoint": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **constraint})
    refused = conn.sent[-1]
    assert isinstance(refused, Rejected) and refused.reason == "invalid_value" and refused.param == param, refused
    submit(worker, conn, "good", {"endpoint": "completions", "prompt": "hello", "max_tokens": 3})
    run(worker)
    assert any(isinstance(m, Done) and m.id == "good" for m in conn.sent)


def test_tools_and_template_variables_count_against_the_context_before_anything_is_rendered() -> None:
    """The worker's own bound (a peer of another version, or a Submit the web side did not
    check) counts the tools and the template's variables, not only the messages' content."""
    worker, conn = make_worker()
    worker.engine.render_chat = lambda *a, **kw: pytest.fail("rendered")  # type: ignore[method-assign]
    hi = [{"role": "user", "content": "hi"}]
    tool = {"name": "f", "description": "d" * 70_000, "parameters": {"type": "object"}}
    for extra in ({"tools": [tool]}, {"chat_template_kwargs": {"notes": "n" * 70_000}}):
        submit(worker, conn, "big", {"endpoint": "chat", "messages": hi, "max_tokens": 3, **extra})
        refused = conn.sent[-1]
        assert isinstance(refused, Rejected) and refused.reason == "context_length_exceeded" and refused.param == "messages", refused
