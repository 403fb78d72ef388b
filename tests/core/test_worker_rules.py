"""The worker's side of the seed's rules, on the simulated engine: fill-in-the-middle prompts,
OS pressure readings, the replan path, cache scopes and the --no-park switch."""

from __future__ import annotations

import argparse
from typing import Any

from scheduler.core.scheduler import SchedulerConfig
from scheduler.core.types import TickPlan, TickResult
from scheduler.engines.base import EngineError
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import INVALID_PROMPT, Accepted, Cancel, Done, Message, Rejected, Submit
from scheduler.management.options import add_engine_arguments, engine_argv, scheduler_config
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


class RefusesOnce(SimEngine):
    """Refuses the first plan that feeds: it runs the plan's lane and cache work, then its
    first engine call fails with nothing fed (llama_decode returning 1)."""

    refused = False

    def execute(self, plan: TickPlan, should_stop: Any) -> TickResult:
        if plan.feeds and not self.refused:
            self.refused = True
            feeds, plan.feeds = plan.feeds, []
            partial = super().execute(plan, should_stop)
            plan.feeds = feeds
            error = EngineError("llama_decode returned 1", permanent=False)
            error.partial = partial  # type: ignore[attr-defined]
            raise error
        return super().execute(plan, should_stop)


def test_a_refused_plan_is_replanned_with_pins_released_and_the_requests_still_finish() -> None:
    worker, conn = make_worker(RefusesOnce(n_lanes=2, lane_ctx=512))
    submit(worker, conn, "a", {"endpoint": "completions", "prompt": "hello " * 10, "max_tokens": 3})
    run(worker)
    assert worker.scheduler.counters["plans_rejected"] == 1
    done = [m for m in conn.sent if isinstance(m, Done)]
    assert [m.id for m in done] == ["a"] and done[0].usage["completion_tokens"] == 3


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


class Abortable(SimEngine):
    """The simulator with llama.cpp's abort hooks, noting each call."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.calls: list[str] = []

    def abort_step(self) -> None:
        self.calls.append("abort")

    def clear_abort(self) -> None:
        self.calls.append("clear")


def test_an_urgent_arrival_or_a_cancel_aborts_the_engine_step_and_the_next_tick_clears_it() -> None:
    engine = Abortable(n_lanes=2, lane_ctx=512)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=512), model_name="sim", prepare_in_thread=False)
    background = Submit("bg", {"endpoint": "completions", "prompt": "x", "max_tokens": 4}, qos=3)
    worker._on_message(background)
    assert engine.calls == [] and not worker.interrupt.is_set()  # a batch job waits for the step
    worker._on_message(Submit("chat", {"endpoint": "completions", "prompt": "x", "max_tokens": 4}, qos=0))
    assert engine.calls == ["abort"] and worker.interrupt.is_set()
    worker._on_message(Cancel("bg"))
    assert engine.calls == ["abort", "abort"]
    worker.drain()
    worker.run(drain_timeout_s=0.0)  # each turn of the loop clears the flag before its tick
    assert engine.calls[2] == "clear" and not worker.interrupt.is_set()
