"""The engine worker's metrics, on the simulated engine: names, labels, and counters that move."""

from __future__ import annotations

import json
from typing import Any

from scheduler.core.qos import QosClass
from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import Message, Submit
from scheduler.worker.loop import EngineWorker
from scheduler.worker.metrics import WorkerMetrics, all_families, families_from_snapshot


class FakeConn:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    def queue(self, message: Message) -> None:
        self.sent.append(message)


def make_worker(max_batch: int = 2) -> tuple[EngineWorker, FakeClock]:
    clock = FakeClock()
    engine = SimEngine(n_lanes=max_batch, lane_ctx=512, clock=clock)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=max_batch, lane_ctx=512), model_name="sim", clock=clock)
    return worker, clock


def submit(worker: EngineWorker, conn: FakeConn, job_id: str, *, qos: QosClass = QosClass.AGENT, priority: int = 0, max_tokens: int = 4) -> None:
    request = {"endpoint": "completions", "prompt": "hello world " * 8, "max_tokens": max_tokens, "temperature": 0}
    worker.handle(conn, Submit(id=job_id, request=request, qos=int(qos), priority=priority))  # type: ignore[arg-type]


def run(worker: EngineWorker, ticks: int = 200) -> None:
    for _ in range(ticks):
        if not worker.run_tick() and worker.scheduler.idle:
            return


def samples(fams: dict[str, Any], name: str) -> dict[tuple[tuple[str, str], ...], Any]:
    return {tuple(sorted(labels.items())): value for labels, value in fams[name]["samples"]}


def test_collect_exports_every_worker_family_with_labels_for_each_class_and_band() -> None:
    worker, _ = make_worker()
    fams = worker.metrics.collect(worker)
    for name in (
        "superfluid_lanes_active",
        "superfluid_lanes",
        "superfluid_queue_depth",
        "superfluid_prefill_budget_tokens",
        "superfluid_decode_grant_tokens",
        "superfluid_ttft_seconds",
        "superfluid_queue_wait_seconds",
        "llamaswap_scheduler_queue_depth",
        "llamaswap_scheduler_queue_oldest_wait_seconds",
        "llamaswap_scheduler_dispatched_total",
    ):
        assert name in fams, name
    assert {labels["class"] for labels, _ in fams["superfluid_queue_depth"]["samples"]} == {"interactive", "completion", "agent", "background"}
    assert {labels["band"] for labels, _ in fams["llamaswap_scheduler_queue_depth"]["samples"]} == {"interactive", "normal", "batch"}
    assert {labels["class"] for labels, _ in fams["superfluid_ttft_seconds"]["samples"]} == {"interactive", "completion", "agent", "background"}
    json.dumps(fams, allow_nan=False)  # plain JSON: the +Inf bucket is a string


def test_queues_by_class_and_band_then_dispatch_ttft_and_queue_wait_move() -> None:
    worker, clock = make_worker(max_batch=1)
    conn = FakeConn()
    submit(worker, conn, "a", priority=0)
    submit(worker, conn, "b", qos=QosClass.BACKGROUND, priority=-100)
    submit(worker, conn, "c", qos=QosClass.BACKGROUND, priority=-100)
    clock.advance(3.0)
    fams = worker.metrics.collect(worker)
    assert samples(fams, "superfluid_queue_depth")[(("class", "background"),)] == 2
    assert samples(fams, "llamaswap_scheduler_queue_depth")[(("band", "batch"),)] == 2
    assert samples(fams, "llamaswap_scheduler_queue_oldest_wait_seconds")[(("band", "batch"),)] == 3.0

    run(worker)
    fams = worker.metrics.collect(worker)
    dispatched = samples(fams, "llamaswap_scheduler_dispatched_total")
    assert dispatched[(("band", "normal"),)] == 1 and dispatched[(("band", "batch"),)] == 2
    ttft = samples(fams, "superfluid_ttft_seconds")
    assert ttft[(("class", "agent"),)]["count"] == 1 and ttft[(("class", "background"),)]["count"] == 2
    assert ttft[(("class", "agent"),)]["buckets"][-1] == ["+Inf", 1]
    wait = samples(fams, "superfluid_queue_wait_seconds")[(("class", "background"),)]
    assert wait["count"] == 2 and wait["sum"] >= 3.0  # both waited behind "a" for at least 3 s
    assert samples(fams, "superfluid_decode_tokens_total")[()] > 0
    assert samples(fams, "superfluid_prefill_tokens_total")[()] >= 3 * 16
    finished = samples(fams, "superfluid_jobs_finished_total")
    assert sum(finished.values()) == 3


def test_dispatches_are_counted_once_even_when_seen_by_both_collect_and_finish() -> None:
    worker, _ = make_worker(max_batch=2)
    conn = FakeConn()
    submit(worker, conn, "x", max_tokens=30)
    worker.run_tick()
    worker.metrics.collect(worker)  # sees "x" running
    run(worker)
    fams = worker.metrics.collect(worker)
    assert samples(fams, "llamaswap_scheduler_dispatched_total")[(("band", "normal"),)] == 1
    assert samples(fams, "superfluid_queue_wait_seconds")[(("class", "agent"),)]["count"] == 1


def test_snapshot_families_carry_counters_and_pool_with_zero_defaults() -> None:
    fams = families_from_snapshot({})
    for name in (
        "superfluid_preemptions_total",
        "superfluid_prefix_cache_hits_total",
        "superfluid_parks_total",
        "superfluid_evictions_total",
        "superfluid_os_pressure_total",
        "superfluid_pool_blocks_used",
        "superfluid_pool_blocks_total",
        "llamaswap_scheduler_reorders_total",
    ):
        assert name in fams, name
    state = {
        "counters": {"preemptions": 3, "evictions": 2, "reorders_aging": 5, "os_pressure_critical": 1, "dispatched_interactive": 7, "dispatched_normal": 1, "dispatched_batch": 0},
        "pool": {"blocks_used": 10, "blocks_total": 64},
        "metrics": WorkerMetrics().collect(make_worker()[0]),
    }
    merged = all_families(state)
    assert samples(merged, "superfluid_preemptions_total")[()] == 3
    assert samples(merged, "superfluid_pool_blocks_used")[()] == 10
    assert samples(merged, "llamaswap_scheduler_reorders_total")[(("reason", "aging"),)] == 5
    assert samples(merged, "superfluid_os_pressure_total")[(("level", "critical"),)] == 1
    assert samples(merged, "llamaswap_scheduler_dispatched_total")[(("band", "interactive"),)] == 7  # the core's count wins


def test_the_worker_snapshot_carries_the_metrics() -> None:
    worker, _ = make_worker()
    snap = worker.snapshot()
    assert "superfluid_lanes_active" in snap["metrics"]
    json.dumps(snap, allow_nan=False)


def test_time_to_first_token_is_observed_while_the_job_still_runs_and_only_once() -> None:
    worker, _ = make_worker(max_batch=1)
    conn = FakeConn()
    submit(worker, conn, "long", max_tokens=50)
    for _ in range(3):
        worker.run_tick()
    assert worker.scheduler.jobs["long"].first_token_s is not None
    fams = worker.metrics.collect(worker)
    assert samples(fams, "superfluid_ttft_seconds")[(("class", "agent"),)]["count"] == 1
    run(worker)
    fams = worker.metrics.collect(worker)
    assert samples(fams, "superfluid_ttft_seconds")[(("class", "agent"),)]["count"] == 1
