"""The engine worker's own metrics, shipped to the web side inside every snapshot.

``collect()`` returns ``{name: {"type", "help", "samples": [[labels, value], ...]}}``; histograms
carry ``{"buckets": [[le, cumulative_count], ...], "sum", "count"}`` per label set instead of a
value. The web process renders them on /metrics beside its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scheduler.core.types import Job, TickPlan, TickResult

if TYPE_CHECKING:
    from .loop import EngineWorker

TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, float("inf"))


class Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1

    def export(self) -> dict[str, Any]:
        return {"buckets": [[b, c] for b, c in zip(self.bounds, self.counts)], "sum": self.sum, "count": self.count}


class WorkerMetrics:
    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS_S)

    def on_tick(self, plan: TickPlan, result: TickResult) -> None:
        pass

    def on_finished(self, job: Job, reason: str | None) -> None:
        if job.first_token_s is not None:
            self.ttft.observe(job.first_token_s - job.arrival_s)

    def collect(self, worker: EngineWorker) -> dict[str, Any]:
        snap = worker.scheduler
        return {
            "superfluid_lanes_active": {
                "type": "gauge",
                "help": "Lanes holding a job.",
                "samples": [[{}, sum(1 for j in snap.lanes if j is not None)]],
            },
            "superfluid_ttft_seconds": {
                "type": "histogram",
                "help": "Time from arrival to first token.",
                "samples": [[{}, self.ttft.export()]],
            },
        }
