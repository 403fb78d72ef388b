"""Jobs cancelled while still queued: the queue depth by class and band, the finish counts and the
dashboard's queue figures drop them at once."""

from __future__ import annotations

from dashboard.feed import dashboard_state
from scheduler.link.messages import Cancel

from .test_worker_metrics import agent_ahead_of_two_background, families, run, samples


def test_a_job_cancelled_while_queued_leaves_the_queue_depth_and_counts_as_cancelled() -> None:
    worker, clock, conn = agent_ahead_of_two_background(agent_tokens=30)
    worker.run_tick()
    clock.advance(2.0)
    worker.handle(conn, Cancel(id="b"))
    worker.handle(conn, Cancel(id="c"))
    worker.run_tick()
    fams = families(worker)
    assert samples(fams, "superfluid_queue_depth")[(("class", "background"),)] == 0
    assert samples(fams, "llamaswap_scheduler_queue_depth")[(("band", "batch"),)] == 0
    assert samples(fams, "superfluid_queue_oldest_wait_seconds")[(("class", "background"),)] == 0
    state = dashboard_state(worker.snapshot())
    assert not any(state["queue_depth"].values())
    run(worker)
    fams = families(worker)
    finished = samples(fams, "superfluid_jobs_finished_total")
    assert sum(v for k, v in finished.items() if ("class", "background") in k) == 2
    assert samples(fams, "superfluid_queue_wait_seconds_count")[(("class", "background"),)] == 0  # never admitted
    assert samples(fams, "superfluid_ttft_seconds_count")[(("class", "background"),)] == 0  # no token: no TTFT
