"""A link drop is not a cancel. When the worker's connection to its web side closes, the web side
keeps the jobs and submits each again (same id, with the text already delivered) on its next
connection (docs/architecture.md, the link). The worker ended those jobs as *cancelled*: each
counted in ``superfluid_cancelled_total`` ("Jobs cancelled (client disconnect or explicit
cancel)", api/metrics.py; no client left), in ``superfluid_jobs_finished_total{reason=
"cancelled"}`` and ``superfluid_finished_total`` beside the finish of the same request once it
was submitted again, and its prompt tokens twice in ``superfluid_prompt_tokens_total`` ("prompt
tokens of finished requests"), while ``superfluid_worker_requests_total`` counts it once."""

from __future__ import annotations

from typing import Any

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import Delta, Done, Submit
from scheduler.worker.loop import EngineWorker
from scheduler.worker.server import Disconnected
from tests.core.builders import RecordingConn


def test_jobs_submitted_again_after_a_link_drop_are_counted_once_and_never_as_cancelled() -> None:
    clock = FakeClock()
    engine = SimEngine(n_lanes=2, lane_ctx=512, clock=clock)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=512), model_name="sim", clock=clock)
    old, new = RecordingConn(), RecordingConn()
    request: dict[str, Any] = {"endpoint": "completions", "prompt": "hello there", "max_tokens": 20}
    worker.handle(old, Submit(id="a", request=request, qos=2))  # type: ignore[arg-type]
    worker.handle(old, Submit(id="b", request=request, qos=2))  # type: ignore[arg-type]
    for _ in range(8):
        worker.run_tick()
    deltas = [m for m in old.sent if isinstance(m, Delta)]
    delivered = {job_id: "".join(d.text for d in deltas if d.id == job_id) for job_id in ("a", "b")}
    tokens = {job_id: max(d.tokens for d in deltas if d.id == job_id) for job_id in ("a", "b")}
    assert all(0 < n < 20 for n in tokens.values())
    worker.handle(old, Disconnected())  # type: ignore[arg-type]
    for job_id in ("a", "b"):  # the web side's resubmission on its new connection
        again = Submit(id=job_id, request=request, qos=2, resume_text=delivered[job_id], resume_tokens=tokens[job_id])
        worker.handle(new, again)  # type: ignore[arg-type]
    for _ in range(500):
        if not worker.run_tick() and worker.scheduler.idle:
            break
    done = {m.id: m for m in new.sent if isinstance(m, Done)}
    assert set(done) == {"a", "b"} and all(d.usage["completion_tokens"] == 20 for d in done.values())
    snapshot = worker.snapshot()
    assert snapshot["counters"]["cancelled"] == 0  # superfluid_cancelled_total: no client left
    assert snapshot["counters"]["finished"] == 2  # superfluid_finished_total
    assert snapshot["metrics"]["finished"] == {"agent": {"length": 2}}  # superfluid_jobs_finished_total
    assert snapshot["metrics"]["requests_total"] == 2
    prompt = done["a"].usage["prompt_tokens"]
    assert snapshot["metrics"]["prompt_tokens_total"] == 2 * prompt  # each request's prompt once
    assert snapshot["metrics"]["completion_tokens_total"] == 2 * 20  # every token generated, once
