"""Answers the worker can give between ticks go out before the next tick, not after it: a refusal
of a new request, and the end of a queued job its client cancelled. A tick can be a prompt step of
seconds on a CPU; the client of a refused or cancelled request has nothing to wait for."""

from __future__ import annotations

import threading
from typing import Any

from scheduler.core.qos import QosClass
from scheduler.link.messages import Cancel, Done, Message, Rejected, Submit, decode
from scheduler.worker.server import Connection

from .conftest import completion, sim_worker


class SentLink:
    """The worker's link as far as its loop uses it: what a flush sends, in order."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.sent: list[Message] = []
        self.lock = threading.Lock()

    def flush(self) -> None:
        with self.lock:
            self.sent += [decode(data) for data in self.conn.outbox]
            self.conn.outbox = []

    def broadcast(self, message: Message) -> None:
        pass

    def ends(self) -> dict[str, Message]:
        with self.lock:
            return {str(m.id): m for m in self.sent if isinstance(m, (Done, Rejected))}


def submit(job_id: str, **request: Any) -> Submit:
    return Submit(id=job_id, request=completion(**request), qos=int(QosClass.AGENT), priority=0)


def test_a_refusal_and_a_queued_cancel_go_out_before_the_next_tick() -> None:
    worker = sim_worker(lanes=1, ctx=512, prepare_in_thread=False)
    conn = Connection(1, None)
    link = SentLink(conn)
    worker.link = link  # type: ignore[assignment]
    real_execute = worker.engine.execute
    calls: list[int] = []
    seen_at_next_tick: dict[str, Message] = {}

    def execute(plan: Any, should_stop: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            # between this tick and the next one: a request the worker refuses (its prompt is
            # longer than a lane), and a cancel of the job waiting for the one lane
            worker.inbox.put((conn, submit("too-long", prompt="word " * 2000, max_tokens=4)))
            worker.inbox.put((conn, Cancel(id="queued")))
        elif len(calls) == 4:
            seen_at_next_tick.update(link.ends())
            worker.drain()  # the loop ends once every job has ended
        return real_execute(plan, should_stop)

    worker.engine.execute = execute  # type: ignore[method-assign]
    worker.inbox.put((conn, submit("running", max_tokens=12)))
    worker.inbox.put((conn, submit("queued", max_tokens=12)))
    runner = threading.Thread(target=worker.run, kwargs={"drain_timeout_s": 10})
    runner.start()
    runner.join(30)
    assert not runner.is_alive()
    ends = link.ends()
    assert isinstance(ends["too-long"], Rejected) and isinstance(ends["queued"], Done), ends
    assert ends["queued"].finish_reason == "cancelled"
    assert isinstance(ends["running"], Done) and ends["running"].finish_reason == "length"
    # both were sent before the tick after their arrival began
    assert set(seen_at_next_tick) == {"too-long", "queued"}, seen_at_next_tick
