"""Every job the worker accepted ends exactly once, on the connection that asked for it, and
what ends a job (a result, a failure, a link drop) touches no other job."""

from __future__ import annotations

import queue
from typing import Any

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import Accepted, Delta, Done, Message, Submit
from scheduler.worker.loop import EngineWorker
from scheduler.worker.server import Disconnected


class FakeConn:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    def queue(self, message: Message) -> None:
        self.sent.append(message)


def run(worker: EngineWorker, ticks: int = 500) -> None:
    for _ in range(ticks):
        if not worker.run_tick() and worker.scheduler.idle:
            return


def preparing_worker() -> EngineWorker:
    """A worker that hands Submits to preparation, with no thread: the test prepares them itself
    (``_prepare_one``) and delivers the results in the order it chooses."""
    clock = FakeClock()
    engine = SimEngine(n_lanes=2, lane_ctx=512, clock=clock)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=512), model_name="sim", clock=clock)
    worker._prepare_queue = queue.PriorityQueue()
    return worker


def test_a_preparation_finished_for_a_dropped_connection_does_not_take_the_resubmitted_jobs_place() -> None:
    """The link drops while a job's prepared result waits in the inbox; the web side submits it
    again (same id) on its new connection. The stale result was admitted for the new Submit, with
    the dead connection's context: the new connection got Accepted, then nothing ever (its deltas
    and Done went to the dead one), and its own prepared result was dropped."""
    worker = preparing_worker()
    old, new = FakeConn(), FakeConn()
    request: dict[str, Any] = {"endpoint": "completions", "prompt": "hello there", "max_tokens": 5}
    first = Submit(id="a", request=request, qos=1)
    worker.handle(old, first)  # type: ignore[arg-type]
    stale = worker._prepare_one(old, first)  # type: ignore[arg-type]
    assert stale is not None  # prepared before the drop: in the inbox behind it
    worker.handle(old, Disconnected())  # type: ignore[arg-type]
    again = Submit(id="a", request=request, qos=1)
    worker.handle(new, again)  # type: ignore[arg-type]
    worker.handle(old, stale)  # type: ignore[arg-type]
    fresh = worker._prepare_one(new, again)  # type: ignore[arg-type]
    if fresh is not None:
        worker.handle(new, fresh)  # type: ignore[arg-type]
    run(worker)
    assert [type(m) for m in old.sent] == []
    assert [type(m) for m in new.sent if not isinstance(m, Delta)] == [Accepted, Done], new.sent
    done = new.sent[-1]
    assert isinstance(done, Done) and done.usage["completion_tokens"] == 5
    assert not worker.contexts and not worker.preparing and worker.scheduler.idle
