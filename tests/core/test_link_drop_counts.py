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
    assert snapshot["metrics"]["queue_wait_s"]["agent"]["count"] == 2  # each request's wait once
    assert snapshot["metrics"]["ttft_s"]["agent"]["count"] == 2
    assert worker.metrics._waited_ids == worker.metrics._ttft_ids == set()  # released at their finish


def test_jobs_never_submitted_again_after_link_drops_do_not_stay_in_the_worker_metrics() -> None:
    """A job whose link dropped is kept in the metrics' sets of jobs whose queue wait and first
    token were observed (so that its resubmission is not observed again); one its web side never
    submits again (a web process that went away) must not stay there for good: the sets grew by
    the jobs in flight at every drop. Such a job is not counted finished here (a resubmission's
    finish would count the same request again); its id is forgotten after DROPPED_IDS others."""
    from scheduler.worker import metrics as metrics_module

    bound = getattr(metrics_module, "DROPPED_IDS", 4096)
    clock = FakeClock()
    engine = SimEngine(n_lanes=2, lane_ctx=512, clock=clock)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=512), model_name="sim", clock=clock)
    request: dict[str, Any] = {"endpoint": "completions", "prompt": "hello there", "max_tokens": 20}
    drops = bound // 2 + 50
    for k in range(drops):
        conn = RecordingConn()
        for job_id in (f"a{k}", f"b{k}"):
            worker.handle(conn, Submit(id=job_id, request=request, qos=2))  # type: ignore[arg-type]
        for _ in range(4):
            worker.run_tick()
        assert any(isinstance(m, Delta) for m in conn.sent)  # first tokens out: both observed
        worker.snapshot()
        worker.handle(conn, Disconnected())  # type: ignore[arg-type]
    worker.run_tick()
    metrics = worker.metrics
    assert len(metrics._waited_ids) <= bound
    assert len(metrics._ttft_ids) <= bound
    snapshot = worker.snapshot()
    assert snapshot["metrics"]["requests_total"] == 2 * drops
    assert snapshot["metrics"]["finished"] == {}  # not counted finished: no finish was seen
    assert snapshot["metrics"]["queue_wait_s"]["agent"]["count"] == 2 * drops  # each wait observed once
    assert worker.scheduler.jobs == {} and worker.contexts == {}
