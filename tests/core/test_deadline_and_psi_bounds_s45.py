"""Rules of docs/scheduling.md that no test could fail: --completion-deadline-ms is for the
completion class alone, and the PSI thresholds hold at exactly their values."""

from __future__ import annotations

import pytest

from scheduler.engines.sim import FakeClock
from scheduler.link.messages import DEADLINE_EXCEEDED, Done, Error, Submit
from scheduler.worker.pressure import pressure_level

from .test_arrival_timing import FakeConn, request, run, worker_on


def test_the_completion_deadline_drops_only_completion_class_jobs() -> None:
    """One lane, held by a long job for seconds (no preemption): an interactive, an agent and a
    completion job all wait past --completion-deadline-ms. Only the completion is dropped with
    completion_deadline_exceeded; a chat or an agent that waits that long still runs."""
    clock = FakeClock()
    worker, conn = worker_on(clock, lanes=1, completion_deadline_ms=500, config={"preemption": False}), FakeConn()
    worker.handle(conn, Submit("busy", request(max_tokens=60), qos=2))
    worker.run_tick()
    for job_id, qos in (("chat", 0), ("fim", 1), ("agent", 2), ("batch", 3)):
        worker.handle(conn, Submit(job_id, request(), qos=qos))
    run(worker)
    errors = {m.id: m.reason for m in conn.sent if isinstance(m, Error)}
    done = {m.id for m in conn.sent if isinstance(m, Done)}
    assert errors == {"fim": DEADLINE_EXCEEDED}
    assert done == {"busy", "chat", "agent", "batch"}


@pytest.mark.parametrize(
    ("some", "full", "level"),
    [
        (9.99, 0.0, None),
        (10.0, 0.0, "warning"),  # some avg10 >= 10
        (49.99, 0.0, "warning"),
        (50.0, 0.0, "critical"),  # some avg10 >= 50
        (0.0, 9.99, None),
        (0.0, 10.0, "critical"),  # full avg10 >= 10
    ],
)
def test_psi_levels_rise_at_exactly_their_thresholds(some: float, full: float, level: str | None) -> None:
    assert pressure_level(some, full) == level
