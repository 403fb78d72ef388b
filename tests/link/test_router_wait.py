"""Several models: a request's wait at the model router goes to its worker in the Submit
(``waited_ms``), which counts its times and histograms from then; the activity row counts the
router's wait once."""

from __future__ import annotations

from typing import Any

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import Done, Message, Submit
from scheduler.worker.loop import EngineWorker

ROUTER = {"serial_priority": 0, "serial_band": "normal", "serial_score": 10.0, "serial_queue_wait_ms": 2500}


class Conn:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    def queue(self, message: Message) -> None:
        self.sent.append(message)


def worker_done(clock: FakeClock, **fields: Any) -> Done:
    """The Done of one request served by a worker on ``clock``, its Submit carrying ``fields``."""
    engine = SimEngine(n_lanes=1, lane_ctx=512, clock=clock)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=512), model_name="sim", clock=clock)
    conn = Conn()
    worker.handle(conn, Submit("j", {"endpoint": "completions", "prompt": "hello", "max_tokens": 3}, qos=2, **fields))
    for _ in range(100):
        if not worker.run_tick() and worker.scheduler.idle:
            break
    return next(m for m in conn.sent if isinstance(m, Done))


def consumer(router: dict[str, Any] | None) -> Any:
    from api.consumers import CompletionsConsumer

    c = CompletionsConsumer()
    if router is not None:
        c.router_serial = dict(router)
    return c


def test_the_submit_carries_the_routers_wait_only_with_several_models() -> None:
    assert consumer(ROUTER).router_wait() == {"waited_ms": 2500}
    assert consumer(None).router_wait() == {}  # one model: no router, the Submit as before


def test_the_activity_row_counts_the_routers_wait_once() -> None:
    """The worker counts the 2.5 s at the router (its Submit said so) in its queue wait, TTFT
    and total: the row adds nothing more (it added the router's wait to them again: 5 s)."""
    c = consumer(ROUTER)
    done = worker_done(FakeClock(), waited_ms=ROUTER["serial_queue_wait_ms"])  # what router_wait() gives
    c.note_done(done)
    timing, worker = c.record.timing, done.timing
    assert timing["queue_wait_ms"] == worker["queue_wait_ms"] == 2500.0
    assert (timing["ttft_ms"], timing["total_ms"]) == (worker["ttft_ms"], worker["total_ms"])
    assert timing["ttft_ms"] > 2500.0
    assert c.record.serial == {**ROUTER, "serial_queue_wait_ms": 2500}


def test_the_activity_row_adds_the_routers_wait_that_a_worker_did_not_count() -> None:
    """A worker that does not know ``waited_ms`` (another version) counts from its receipt: the
    row adds the router's wait to its times, as before."""
    c = consumer(ROUTER)
    done = worker_done(FakeClock())  # no waited_ms in the Submit, none in the Done's timing
    assert "waited_ms" not in done.timing
    c.note_done(done)
    assert c.record.timing["queue_wait_ms"] == 2500.0
    assert c.record.timing["ttft_ms"] == done.timing["ttft_ms"] + 2500
    assert c.record.serial["serial_queue_wait_ms"] == 2500


def test_without_a_router_the_row_is_the_workers_timing() -> None:
    c = consumer(None)
    done = worker_done(FakeClock())
    c.note_done(done)
    assert c.record.timing == {k: done.timing[k] for k in ("queue_wait_ms", "held_wait_ms", "ttft_ms", "total_ms", "preemptions")}
    assert c.record.serial == done.serial
