"""A drain and the Submits on their way: one the worker's link reader read before the drain
began is served, even when it reaches the tick thread's inbox just after the loop emptied it."""

from __future__ import annotations

from scheduler.core.qos import QosClass
from scheduler.link.messages import Done, Submit, decode
from scheduler.worker.server import Connection

from .conftest import completion, sim_worker


def test_a_submit_read_before_the_drain_is_served_though_it_reached_the_inbox_as_the_loop_looked() -> None:
    """The link's reader stamps a Submit as read (before the drain: it will be served), then puts
    it in the inbox. The tick thread, idle and draining, emptied its inbox just before that put
    and stopped: the job was never answered (the web side's link then failed it with 503
    shutdown as the worker went), though the drain serves what was on its way."""
    worker = sim_worker(prepare_in_thread=False)
    conn = Connection(1, None)
    submit = Submit(id="on-its-way", request=completion(max_tokens=4), qos=int(QosClass.AGENT), priority=0)
    worker._on_message(submit)  # the reader read it before the drain began
    worker.drain()
    real_drain_inbox = worker._drain_inbox
    put: list[bool] = []

    def drain_inbox(block_s: float) -> None:
        real_drain_inbox(block_s)
        if not put:  # the reader's put lands just after the loop has emptied the inbox
            put.append(True)
            worker.inbox.put((conn, submit))

    worker._drain_inbox = drain_inbox  # type: ignore[method-assign]
    worker.run(drain_timeout_s=10)
    ends = [m for m in map(decode, conn.outbox) if getattr(m, "id", None) == submit.id and m.type in ("done", "error", "rejected")]
    assert len(ends) == 1 and isinstance(ends[0], Done), ends
