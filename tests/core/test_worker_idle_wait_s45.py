"""The worker's loop with jobs queued that no tick can run yet (background under critical OS
memory pressure, and for 5 s after it): it waits for a message between ticks, as when it has no
job at all, instead of planning empty ticks back to back."""

from __future__ import annotations

from scheduler.core.qos import QosClass
from scheduler.link.messages import Submit
from tests.core.test_worker_rules import make_worker


def test_a_worker_holding_background_jobs_under_critical_pressure_waits_instead_of_spinning() -> None:
    """A background job queued while the OS reads critical: no lane may take it until the
    pressure has eased for 5 s. The loop planned an empty tick, found nothing to do and planned
    the next at once: ~20,000 empty ticks a second, one core at 100% for as long as the memory
    pressure lasted (and the tick counter on the admin page and /metrics racing)."""
    worker, conn = make_worker()
    worker.handle(conn, Submit(id="bg", request={"endpoint": "completions", "prompt": [10, 11, 12], "max_tokens": 2}, qos=3))
    assert worker.scheduler.jobs["bg"].qos is QosClass.BACKGROUND
    worker.scheduler.on_os_pressure("critical")
    waits: list[float] = []

    def take_messages(block_s: float) -> None:  # the loop's wait for the link's messages
        waits.append(block_s)
        if len(waits) == 6:  # end the loop: the job goes, the worker drains and stops
            worker.scheduler.cancel("bg")
            worker.drain()

    worker._take_messages = take_messages  # type: ignore[method-assign]
    worker.run(drain_timeout_s=5.0)
    assert worker.scheduler.tick <= len(waits)
    assert "bg" not in worker.scheduler.jobs
    # the first turn ticks (a new job may be admissible); every turn after a tick that had
    # nothing to do waits for a message (up to 50 ms) before it plans again
    assert waits[0] == 0.0
    assert all(w > 0 for w in waits[1:]), waits
