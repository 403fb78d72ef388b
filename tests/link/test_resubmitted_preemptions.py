"""A job submitted again after its worker was lost (a local worker crash, a link drop) reported
only the last worker's preemptions: its Done's ``timing["preemptions"]`` (the activity row, the
access log) counts the jobs this worker preempted, and nothing told the web side how many times
the lost worker had preempted it. A Delta now carries the worker's count so far, and the web side
adds the count of the workers it lost to the Done of the one that finished the job."""

from __future__ import annotations

import time
from typing import Any

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.client import SocketTransport
from scheduler.link.messages import Delta, Done, Submit, decode, encode
from scheduler.worker.loop import EngineWorker
from tests.core.builders import RecordingConn

from .conftest import completion, hello


def test_a_delta_carries_the_preemptions_of_its_job_so_far() -> None:
    clock = FakeClock()
    engine = SimEngine(n_lanes=1, lane_ctx=512, clock=clock)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=512), model_name="sim", clock=clock)

    conn = RecordingConn()
    worker.handle(conn, Submit("agent", {"endpoint": "completions", "prompt": "an agent's prompt", "max_tokens": 30}, qos=2))  # type: ignore[arg-type]
    for _ in range(6):
        worker.run_tick()
    worker.handle(conn, Submit("chat", {"endpoint": "completions", "prompt": "hello", "max_tokens": 3}, qos=0))  # type: ignore[arg-type]
    for _ in range(500):
        if not worker.run_tick() and worker.scheduler.idle:
            break
    deltas = [m for m in conn.sent if isinstance(m, Delta) and m.id == "agent"]
    done = next(m for m in conn.sent if isinstance(m, Done) and m.id == "agent")
    assert done.timing["preemptions"] == 1  # the chat took its only lane
    assert deltas[0].preemptions == 0 and deltas[-1].preemptions == 1
    assert decode(encode(deltas[-1])) == deltas[-1]
    assert decode(b'{"type":"delta","id":"x","text":"a","tokens":1}') == Delta("x", "a", 1)  # an older worker's: 0


class Recording(SocketTransport):
    """The local socket link with no socket: the test plays the worker."""

    def __init__(self) -> None:
        super().__init__("")
        self.sent: list[Any] = []

    async def _send(self, data: bytes) -> None:
        self.sent.append(decode(data))


async def test_a_job_submitted_again_after_its_worker_was_lost_reports_every_workers_preemptions() -> None:
    link = Recording()
    await link._on_hello(hello(1))
    handle = await link.submit(request=completion("once upon a time"))
    link._on_message(Delta(handle.job_id, "abc", 3, preemptions=2))  # preempted twice at the first worker
    link._on_lost(time.monotonic())
    await link._on_hello(hello(2))
    again = [m for m in link.sent if isinstance(m, Submit) and m.id == handle.job_id]
    assert len(again) == 2 and again[-1].resume_tokens == 3
    link._on_message(Delta(handle.job_id, "d", 4, preemptions=1))
    link._on_message(Done(handle.job_id, "length", usage={"completion_tokens": 40}, timing={"total_ms": 5.0, "preemptions": 1}))
    events = [handle.events.get_nowait() for _ in range(handle.events.qsize())]
    done = next(e for e in events if isinstance(e, Done))
    assert done.timing["preemptions"] == 3  # 2 at the lost worker, 1 at the one that finished it
    assert done.timing["total_ms"] == 5.0


async def test_a_job_never_lost_reports_its_workers_preemptions_as_they_are() -> None:
    link = Recording()
    await link._on_hello(hello(1))
    handle = await link.submit(request=completion("once upon a time"))
    link._on_message(Delta(handle.job_id, "abc", 3, preemptions=1))
    link._on_message(Done(handle.job_id, "length", timing={"preemptions": 1}))
    events = [handle.events.get_nowait() for _ in range(handle.events.qsize())]
    assert next(e for e in events if isinstance(e, Done)).timing["preemptions"] == 1


def test_a_resubmission_made_twice_for_one_loss_counts_the_lost_workers_preemptions_once() -> None:
    """The Redis link builds the resubmission again when its first enqueue failed (the stream's
    reader reads the loss marker again): the lost worker's count is added once, where every
    transport submits a job again (``JobHandle.resubmission``)."""
    from scheduler.link.transport import JobHandle

    handle = JobHandle("j", Submit("j", {"endpoint": "completions", "prompt": "p"}))
    handle.preemptions = 2
    handle.resubmission()
    handle.resubmission()
    assert handle.preemptions_lost == 2 and handle.preemptions == 0
