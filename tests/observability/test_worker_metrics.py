"""The engine worker's statistics, on the simulated engine, and the /metrics families named from
them: names, labels, and counters that move."""

from __future__ import annotations

import json
from typing import Any

from api.metrics import snapshot_families
from scheduler.core.qos import QosClass
from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import Message, Submit
from scheduler.worker.loop import EngineWorker
from scheduler.worker.metrics import WorkerStats


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


def agent_ahead_of_two_background(*, agent_tokens: int = 4) -> tuple[EngineWorker, FakeClock, FakeConn]:
    """A worker of one lane with agent job "a" queued ahead of background jobs "b" and "c"
    (priority -100, band batch)."""
    worker, clock = make_worker(max_batch=1)
    conn = FakeConn()
    submit(worker, conn, "a", max_tokens=agent_tokens)
    submit(worker, conn, "b", qos=QosClass.BACKGROUND, priority=-100)
    submit(worker, conn, "c", qos=QosClass.BACKGROUND, priority=-100)
    return worker, clock, conn


def run(worker: EngineWorker, ticks: int = 200) -> None:
    for _ in range(ticks):
        if not worker.run_tick() and worker.scheduler.idle:
            return


def stats(worker: EngineWorker) -> WorkerStats:
    return worker.metrics.collect(worker.scheduler, worker.stats)


def families(worker: EngineWorker) -> dict[str, Any]:
    """The /metrics families of the worker's snapshot, by family name (counters without _total)."""
    return {f.name: f for f in snapshot_families(worker.snapshot())}


def samples(fams: dict[str, Any], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Sample name -> {labels: value}: ``name`` is a sample's name (x_total, x_count, x_bucket)."""
    out = {}
    for fam in fams.values():
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    assert out, f"no sample {name}"
    return out


def test_every_worker_family_is_named_with_labels_for_each_class_and_band() -> None:
    worker, _ = make_worker()
    fams = families(worker)
    for name, kind in (
        ("superfluid_lanes_active", "gauge"),
        ("superfluid_lanes", "gauge"),
        ("superfluid_queue_depth", "gauge"),
        ("superfluid_prefill_budget_tokens", "gauge"),
        ("superfluid_decode_grant_tokens", "gauge"),
        ("superfluid_ttft_seconds", "histogram"),
        ("superfluid_queue_wait_seconds", "histogram"),
        ("llamaswap_scheduler_queue_depth", "gauge"),
        ("llamaswap_scheduler_queue_oldest_wait_seconds", "gauge"),
        ("llamaswap_scheduler_dispatched", "counter"),
    ):
        assert fams[name].type == kind, name
    assert {labels[0][1] for labels in samples(fams, "superfluid_queue_depth")} == {"interactive", "completion", "agent", "background"}
    assert {labels[0][1] for labels in samples(fams, "llamaswap_scheduler_queue_depth")} == {"interactive", "normal", "batch"}
    assert {dict(labels)["class"] for labels in samples(fams, "superfluid_ttft_seconds_count")} == {"interactive", "completion", "agent", "background"}
    json.dumps(stats(worker), allow_nan=False)  # plain JSON: no infinite bucket bound


def test_queues_by_class_and_band_then_dispatch_ttft_and_queue_wait_move() -> None:
    worker, clock, _ = agent_ahead_of_two_background()
    clock.advance(3.0)
    fams = families(worker)
    assert samples(fams, "superfluid_queue_depth")[(("class", "background"),)] == 2
    assert samples(fams, "llamaswap_scheduler_queue_depth")[(("band", "batch"),)] == 2
    assert samples(fams, "llamaswap_scheduler_queue_oldest_wait_seconds")[(("band", "batch"),)] == 3.0

    run(worker)
    fams = families(worker)
    dispatched = samples(fams, "llamaswap_scheduler_dispatched_total")
    assert dispatched[(("band", "normal"),)] == 1 and dispatched[(("band", "batch"),)] == 2
    ttft = samples(fams, "superfluid_ttft_seconds_count")
    assert ttft[(("class", "agent"),)] == 1 and ttft[(("class", "background"),)] == 2
    assert samples(fams, "superfluid_ttft_seconds_bucket")[(("class", "agent"), ("le", "+Inf"))] == 1
    assert samples(fams, "superfluid_queue_wait_seconds_count")[(("class", "background"),)] == 2
    assert samples(fams, "superfluid_queue_wait_seconds_sum")[(("class", "background"),)] >= 3.0  # both waited behind "a"
    assert samples(fams, "superfluid_decode_tokens_total")[()] > 0
    assert samples(fams, "superfluid_prefill_tokens_total")[()] >= 3 * 16
    assert sum(samples(fams, "superfluid_jobs_finished_total").values()) == 3


def test_dispatches_and_queue_waits_are_counted_once_even_when_seen_by_both_collect_and_finish() -> None:
    worker, _ = make_worker(max_batch=2)
    conn = FakeConn()
    submit(worker, conn, "x", max_tokens=30)
    worker.run_tick()
    stats(worker)  # sees "x" running
    run(worker)
    fams = families(worker)
    assert samples(fams, "llamaswap_scheduler_dispatched_total")[(("band", "normal"),)] == 1
    assert samples(fams, "superfluid_queue_wait_seconds_count")[(("class", "agent"),)] == 1


def test_snapshot_families_carry_counters_and_pool_with_zero_defaults() -> None:
    empty = {f.name: f for f in snapshot_families({})}
    for name in (
        "superfluid_preemptions",
        "superfluid_prefix_cache_hits",
        "superfluid_parks",
        "superfluid_evictions",
        "superfluid_os_pressure",
        "superfluid_pool_blocks_used",
        "superfluid_pool_blocks_total",
        "llamaswap_scheduler_reorders",
        "superfluid_lanes_active",
    ):
        assert name in empty, name
    assert samples(empty, "superfluid_preemptions_total")[()] == 0
    state = {
        "counters": {"preemptions": 3, "evictions": 2, "reorders_aging": 5, "os_pressure_critical": 1, "dispatched_interactive": 7, "dispatched_normal": 1, "dispatched_batch": 0},
        "pool": {"blocks_used": 10, "blocks_total": 64},
        "metrics": stats(make_worker()[0]),
    }
    merged = {f.name: f for f in snapshot_families(state)}
    assert samples(merged, "superfluid_preemptions_total")[()] == 3
    assert samples(merged, "superfluid_pool_blocks_used")[()] == 10
    assert samples(merged, "llamaswap_scheduler_reorders_total")[(("reason", "aging"),)] == 5
    assert samples(merged, "superfluid_os_pressure_total")[(("level", "critical"),)] == 1
    assert samples(merged, "llamaswap_scheduler_dispatched_total")[(("band", "interactive"),)] == 7  # the core's count


def test_the_worker_snapshot_carries_its_statistics_as_plain_json() -> None:
    worker, _ = make_worker()
    snap = worker.snapshot()
    assert snap["metrics"]["lanes_total"] == 2 and snap["metrics"]["lanes_by_state"]["idle"] == 2
    json.dumps(snap, allow_nan=False)


def test_time_to_first_token_is_observed_while_the_job_still_runs_and_only_once() -> None:
    worker, _ = make_worker(max_batch=1)
    conn = FakeConn()
    submit(worker, conn, "long", max_tokens=50)
    for _ in range(3):
        worker.run_tick()
    assert worker.scheduler.jobs["long"].first_token_s is not None
    assert stats(worker)["ttft_s"]["agent"]["count"] == 1
    run(worker)
    assert stats(worker)["ttft_s"]["agent"]["count"] == 1


def test_a_redis_fleet_snapshot_gives_the_fleet_families_and_a_plain_one_none() -> None:
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    class One:
        def __init__(self, state: dict[str, Any]) -> None:
            self.state = state

        def collect(self) -> Any:
            return snapshot_families(self.state)

    fleet = {
        "fleet": [
            {"worker": "w1", "host": "a", "n_lanes": 4, "lanes": [{"job_id": "j1"}, {"job_id": None}, {}, {}]},
            {"worker": "w2", "host": "b", "n_lanes": 2, "lanes": [{"job_id": "j2"}, {"job_id": "j3"}]},
        ],
        "global_queue": {"interactive": 0, "agent": 3},
    }
    registry = CollectorRegistry()
    registry.register(One(fleet))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert "superfluid_fleet_workers 2.0" in text
    assert 'superfluid_fleet_lanes{host="a",worker="w1"} 4.0' in text
    assert 'superfluid_fleet_lanes_busy{host="a",worker="w1"} 1.0' in text and 'superfluid_fleet_lanes_busy{host="b",worker="w2"} 2.0' in text
    assert 'superfluid_global_queue_depth{class="agent"} 3.0' in text
    plain = CollectorRegistry()
    plain.register(One({}))  # type: ignore[arg-type]
    assert "superfluid_fleet" not in generate_latest(plain).decode() and "superfluid_global_queue_depth" not in generate_latest(plain).decode()


def test_a_preempted_jobs_wait_counts_from_when_it_went_back_to_the_queue() -> None:
    """The oldest-wait gauges counted from arrival: a background job that had run for 3 s and
    was just preempted showed 3 s of waiting."""
    worker, clock = make_worker(max_batch=1)
    conn = FakeConn()
    submit(worker, conn, "bg", qos=QosClass.BACKGROUND, priority=-100, max_tokens=100)
    for _ in range(3):
        worker.run_tick()
    clock.advance(3.0)
    submit(worker, conn, "chat", qos=QosClass.INTERACTIVE, priority=100)
    worker.run_tick()  # the chat preempts the background job, which queues again
    assert worker.scheduler.jobs["bg"].lane is None
    clock.advance(0.5)
    fams = families(worker)
    # half a second, and the chat's tick (the simulated engine's clock): not the 3 s it ran
    assert samples(fams, "llamaswap_scheduler_queue_oldest_wait_seconds")[(("band", "batch"),)] < 1.5
    assert samples(fams, "superfluid_queue_oldest_wait_seconds")[(("class", "background"),)] < 1.5


def test_tokens_of_a_tick_the_engine_refused_part_way_are_counted_as_fed() -> None:
    """A plan the engine refuses after some of its steps ran is committed as far as it ran (its
    prompt chunks count as computed, its sampled tokens go to their clients); the fed-token
    totals skipped them, so they fell short of what the engine was fed."""
    from scheduler.core.types import TickPlan, TickResult
    from scheduler.engines.base import EngineError

    class RefusesAfterRunning(SimEngine):
        refusals = 2

        def execute(self, plan: TickPlan, should_stop: Any) -> TickResult:
            result = super().execute(plan, should_stop)
            if plan.feeds and self.refusals and len(self.calls) % 3 == 0:  # as if a later step was refused
                self.refusals -= 1
                raise EngineError("llama_decode returned 1", permanent=False, partial=result)
            return result

    clock = FakeClock()
    engine = RefusesAfterRunning(n_lanes=2, lane_ctx=512, clock=clock)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=512), model_name="sim", clock=clock)
    conn = FakeConn()
    submit(worker, conn, "a", max_tokens=6)
    submit(worker, conn, "b", max_tokens=6)
    run(worker)
    assert worker.scheduler.counters["plans_rejected"] == 2 and engine.refusals == 0
    fed = sum(n for call in engine.calls for _lane, n in call)  # "b" copies the shared prompt from "a"
    got = stats(worker)
    assert got["prefill_tokens_total"] + got["decode_tokens_total"] == fed


def test_the_peak_of_busy_lanes_counts_a_job_that_finished_in_the_tick_it_ran() -> None:
    """Busy lanes were counted after the tick's commit had freed the lanes of the jobs it
    finished: a job admitted and finished in one tick (max_tokens 1) left the peak at 0."""
    worker, _ = make_worker()
    submit(worker, FakeConn(), "one", max_tokens=1)
    run(worker)
    assert worker.stats["peak_lanes_active"] == 1
