"""The oldest-wait gauges say how long the longest-waiting request has waited (the seed's
llamaswap_scheduler_queue_oldest_wait_seconds): a job that waited before it reached its worker
(at the model router for a swap or a load, in the Redis queue, for its worker to connect:
Submit's ``waited_ms``) has waited that long too, as its queue-wait histogram and its activity
row count it, until its first admission; a preempted job counts from when it queued again."""

from __future__ import annotations

from scheduler.core.qos import QosClass
from scheduler.link.messages import Submit

from .test_worker_metrics import FakeConn, families, make_worker, samples, submit


def test_a_job_that_waited_at_the_router_shows_that_wait_in_the_oldest_wait_gauges() -> None:
    worker, clock = make_worker(max_batch=1)
    conn = FakeConn()
    submit(worker, conn, "running", max_tokens=100)
    worker.run_tick()
    request = {"endpoint": "completions", "prompt": "hello world " * 8, "max_tokens": 4, "temperature": 0}
    worker.handle(conn, Submit(id="swapped", request=request, qos=int(QosClass.AGENT), priority=0, waited_ms=30_000))
    worker.run_tick()
    assert worker.scheduler.jobs["swapped"].lane is None  # it waits for the one lane
    clock.advance(1.0)
    fams = families(worker)
    assert samples(fams, "llamaswap_scheduler_queue_oldest_wait_seconds")[(("band", "normal"),)] >= 31.0
    assert samples(fams, "superfluid_queue_oldest_wait_seconds")[(("class", "agent"),)] >= 31.0
