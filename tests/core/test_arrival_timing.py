"""A job's waits count from when its request arrived: before the worker prepared its prompt (and
any wait in the inbox or behind other prompts), and, with several models, before its wait at the
router (``Submit.waited_ms``). Queue wait and TTFT (the Done timing, the worker's histograms)
and score aging count from there; class aging and the completion deadline from when the worker
received it."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import DEADLINE_EXCEEDED, INVALID_JOB, Done, Error, Message, Rejected, Submit, decode
from scheduler.worker.loop import EngineWorker

from .builders import make_job, make_scheduler, run_until_idle, tick


class FakeConn:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    def queue(self, message: Message) -> None:
        self.sent.append(message)


def worker_on(clock: FakeClock, lanes: int = 2, **kwargs: Any) -> EngineWorker:
    engine = SimEngine(n_lanes=lanes, lane_ctx=512, clock=clock)
    config = SchedulerConfig(max_batch=lanes, lane_ctx=512, **kwargs.pop("config", {}))
    return EngineWorker(engine, config, model_name="sim", clock=clock, **kwargs)


def request(prompt: str = "hello world", max_tokens: int = 3) -> dict[str, Any]:
    return {"endpoint": "completions", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}


def run(worker: EngineWorker, ticks: int = 500) -> None:
    for _ in range(ticks):
        if not worker.run_tick() and worker.scheduler.idle:
            return


def dones(conn: FakeConn) -> dict[str, Done]:
    return {m.id: m for m in conn.sent if isinstance(m, Done)}


def histograms(worker: EngineWorker, label: str) -> tuple[float, float]:
    """(queue wait sum, TTFT sum) in the worker's statistics (``superfluid_*_seconds``)."""
    stats: Any = worker.metrics.collect(worker.scheduler, worker.stats)
    return stats["queue_wait_s"][label]["sum"], stats["ttft_s"][label]["sum"]


def test_the_time_spent_being_prepared_counts_in_the_queue_wait_the_ttft_and_the_histograms() -> None:
    """The serving worker renders and tokenises prompts on its preparation thread: "a" takes 2 s
    there, "b" waits those 2 s behind it. Both were counted from when they were queued after
    it, so their queue wait was 0 and the histograms never saw the 4 s."""
    clock = FakeClock()
    worker = worker_on(clock, prepare_in_thread=True)
    build = worker._build

    def slow_build(conn: Any, message: Submit) -> Any:
        if message.id == "a":
            clock.advance(2.0)  # a long prompt rendered and tokenised
        return build(conn, message)

    worker._build = slow_build  # type: ignore[method-assign]
    conn = FakeConn()
    worker.handle(conn, Submit("a", request(), qos=2))
    worker.handle(conn, Submit("b", request(), qos=2))
    for _ in range(2):  # the two Prepared results, in the tick thread's inbox
        source, prepared = worker.inbox.get(timeout=10)
        worker.handle(source, prepared)
    run(worker)
    done = dones(conn)
    assert [done[j].timing["queue_wait_ms"] for j in ("a", "b")] == [2000.0, 2000.0]
    assert all(done[j].timing["ttft_ms"] > 2000.0 and done[j].serial["serial_queue_wait_ms"] == 2000.0 for j in "ab")
    queue_wait, ttft = histograms(worker, "agent")
    assert queue_wait == pytest.approx(4.0) and ttft > 4.0


def test_the_time_a_submit_waits_in_the_inbox_for_the_tick_in_flight_counts() -> None:
    """A Submit is stamped as its reader thread hands it over (``_on_message``), not when the
    tick thread drains the inbox after the tick in flight (1.5 s here)."""
    clock = FakeClock()
    worker, conn = worker_on(clock), FakeConn()
    message = Submit("a", request(), qos=2)
    worker._on_message(message)
    clock.advance(1.5)
    worker.handle(conn, message)
    run(worker)
    assert dones(conn)["a"].timing["queue_wait_ms"] == 1500.0
    assert histograms(worker, "agent")[0] == pytest.approx(1.5)


def test_the_wait_at_the_router_counts_in_the_done_timing_and_the_histograms() -> None:
    """With several models the request waited 2.5 s at the router (a load) before its Submit:
    the worker counts its times from then and says it did (``waited_ms``), so the web side does
    not add it again."""
    clock = FakeClock()
    worker, conn = worker_on(clock), FakeConn()
    worker.handle(conn, Submit("a", request(), qos=0, waited_ms=2500))
    run(worker)
    timing = dones(conn)["a"].timing
    assert timing["queue_wait_ms"] == 2500.0 and timing["waited_ms"] == 2500.0
    assert timing["ttft_ms"] > 2500.0 and timing["total_ms"] >= timing["ttft_ms"]
    queue_wait, ttft = histograms(worker, "interactive")
    assert queue_wait == pytest.approx(2.5) and ttft > 2.5
    # a Submit without it (one model, or an older web side): counted from its receipt, as before
    worker.handle(conn, Submit("b", request(), qos=0))
    run(worker)
    assert dones(conn)["b"].timing["queue_wait_ms"] == 0.0 and "waited_ms" not in dones(conn)["b"].timing


def test_the_wait_at_the_router_counts_in_score_aging_but_does_not_lift_the_jobs_class() -> None:
    """Score aging (priority + waited seconds / --aging-divisor) counts from the arrival, as the
    router's own score did; class aging counts only the time this worker held the job (the
    router already ordered the wait before it, and a load of 16 s must not make every
    background request an agent one)."""
    clock = FakeClock()
    worker, conn = worker_on(clock, lanes=1, config={"aging_divisor_s": 60.0}), FakeConn()
    worker.handle(conn, Submit("busy", request(max_tokens=5), qos=2))
    worker.run_tick()
    # same class: 2 minutes at the router (+2) beats priority 1 submitted before it
    worker.handle(conn, Submit("first-sent", request(), qos=2, priority=1))
    worker.handle(conn, Submit("waited-long", request(), qos=2, priority=0, waited_ms=120_000))
    # another class: a background job that waited 60 s at the router stays behind an agent's
    worker.handle(conn, Submit("background", request(), qos=3, waited_ms=60_000))
    worker.handle(conn, Submit("agent", request(), qos=2, priority=-1))
    run(worker)
    finished = [m.id for m in conn.sent if isinstance(m, Done)]
    assert finished == ["busy", "waited-long", "first-sent", "agent", "background"]


def test_the_completion_deadline_counts_from_when_the_worker_received_the_submit() -> None:
    """--completion-deadline-ms is a start deadline from the Submit's receipt: 1 s in the inbox
    behind a tick (or in preparation) counts against 500 ms (it was set after preparation)."""
    clock = FakeClock()
    worker, conn = worker_on(clock, completion_deadline_ms=500), FakeConn()
    message = Submit("fim", request(), qos=1)
    worker._on_message(message)
    clock.advance(1.0)
    worker.handle(conn, message)
    run(worker)
    assert [(type(m), getattr(m, "reason", None)) for m in conn.sent[1:]] == [(Error, DEADLINE_EXCEEDED)]


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), 10**12, "5", True, None])
def test_a_waited_time_that_is_not_milliseconds_in_range_is_refused_and_the_worker_goes_on(value: Any) -> None:
    """Only the web side sets ``waited_ms`` (the router's wait, an int); anything else comes from
    a peer of another version or a bug, and must not make an arrival in the future, NaN or
    infinitely old (the histograms, aging): refused like a malformed priority."""
    clock = FakeClock()
    worker, conn = worker_on(clock), FakeConn()
    worker.handle(conn, Submit("bad", request(), qos=2, waited_ms=value))
    assert [(type(m), getattr(m, "reason", None)) for m in conn.sent] == [(Rejected, INVALID_JOB)]
    worker.handle(conn, Submit("good", request(), qos=2, waited_ms=0))
    run(worker)
    assert list(dones(conn)) == ["good"]


def test_a_nan_waited_time_off_the_wire_is_refused() -> None:
    """The decoder reads JSON's NaN (``json.loads`` takes it): the worker refuses it."""
    clock = FakeClock()
    worker, conn = worker_on(clock), FakeConn()
    message = decode(
        b'{"type":"submit","id":"x","request":{"endpoint":"completions","prompt":"hi","max_tokens":2},"waited_ms":NaN}'
    )
    assert isinstance(message, Submit)
    worker.handle(conn, message)
    assert [(type(m), getattr(m, "reason", None)) for m in conn.sent] == [(Rejected, INVALID_JOB)]


def test_the_scheduler_keeps_an_earlier_arrival_and_never_one_in_the_future() -> None:
    """``add(arrival_s=...)``: the waits count from it; a stamp after now, or not finite, is now."""
    sched, engine, clock = make_scheduler(max_batch=1)
    early, late, odd = make_job(job_id="early"), make_job(job_id="late"), make_job(job_id="odd")
    sched.add(early, arrival_s=clock() - 3.0, enqueued_s=clock() - 1.0)
    sched.add(late, arrival_s=clock() + 5.0)
    sched.add(odd, arrival_s=float("nan"), enqueued_s=float("-inf"))
    assert (early.arrival_s, early.enqueued_s) == (clock() - 3.0, clock() - 1.0)
    assert (late.arrival_s, late.enqueued_s) == (clock(), clock())
    assert (odd.arrival_s, odd.enqueued_s) == (clock(), clock())
    tick(sched, engine)
    assert early.admitted_s is not None and early.admitted_s - early.arrival_s == pytest.approx(3.0)
    run_until_idle(sched, engine)
