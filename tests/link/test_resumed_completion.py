"""A completion's start deadline (--completion-deadline-ms) is for a job that has not started:
one submitted again after its worker was lost, with the text it had streamed, has started."""

from __future__ import annotations

from typing import Any

from scheduler.core.qos import QosClass
from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import DEADLINE_EXCEEDED, Delta, Done, Error, Message, Submit
from scheduler.worker.loop import EngineWorker


class Conn:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    def queue(self, message: Message) -> None:
        self.sent.append(message)


def completion(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"endpoint": "completions", "model": "sim", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}


def test_a_completion_resumed_after_its_worker_was_lost_is_not_ended_for_missing_its_start_deadline() -> None:
    """A completion had streamed "abc" when its worker died; the web side submits it again with
    that text. At the new worker it waits for the one lane: its start deadline was set afresh,
    and the client of a stream already under way got an error frame saying that its completion
    "was not started before its deadline" (the docs: "a started one never does")."""
    clock = FakeClock()
    engine = SimEngine(n_lanes=1, lane_ctx=512, clock=clock)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=512), model_name="sim", clock=clock, completion_deadline_ms=500)
    conn = Conn()
    qos = int(QosClass.COMPLETION)
    worker.handle(conn, Submit(id="running", request=completion("hello", 40), qos=qos))  # type: ignore[arg-type]
    worker.run_tick()
    worker.handle(conn, Submit(id="resumed", request=completion("world", 8), qos=qos, resume_text="abc", resume_tokens=3))  # type: ignore[arg-type]
    clock.advance(1.0)  # past its deadline while "running" holds the lane
    for _ in range(200):
        if not worker.run_tick() and worker.scheduler.idle:
            break
    errors = [m.reason for m in conn.sent if isinstance(m, Error) and m.id == "resumed"]
    assert DEADLINE_EXCEEDED not in errors, errors
    done = [m for m in conn.sent if isinstance(m, Done) and m.id == "resumed"]
    assert len(done) == 1 and done[0].usage["completion_tokens"] == 8, conn.sent  # the 3 delivered, then 5 more
    assert "".join(m.text for m in conn.sent if isinstance(m, Delta) and m.id == "resumed")  # it went on after "abc"


def test_a_job_resumed_with_every_token_delivered_ends_with_length_and_no_token_more() -> None:
    """The lost worker had streamed all of max_tokens but not its Done. Submitted again, the job
    was given a budget of at least one token: a client that asked for one token (a classifier's
    max_tokens=1) got two. And one whose text had reached the end of the context was refused
    mid-stream with context_length_exceeded instead of ending with length."""
    engine = SimEngine(n_lanes=1, lane_ctx=64)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=64), model_name="sim")
    conn = Conn()
    qos = int(QosClass.INTERACTIVE)
    worker.handle(conn, Submit(id="all-sent", request=completion("hello", 3), qos=qos, resume_text="abc", resume_tokens=3))  # type: ignore[arg-type]
    worker.handle(conn, Submit(id="at-the-end", request={**completion("hi", 0), "max_tokens": None}, qos=qos, resume_text="x" * 62, resume_tokens=62))  # type: ignore[arg-type]
    for _ in range(50):
        if not worker.run_tick() and worker.scheduler.idle:
            break
    for job_id, delivered in (("all-sent", 3), ("at-the-end", 62)):
        mine = [m for m in conn.sent if getattr(m, "id", None) == job_id]
        assert not [m for m in mine if isinstance(m, Delta)], mine  # not one token more
        done = [m for m in mine if isinstance(m, Done)]
        assert len(done) == 1 and done[0].finish_reason == "length" and done[0].usage["completion_tokens"] == delivered, mine
