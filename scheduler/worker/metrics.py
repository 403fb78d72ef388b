"""The engine worker's own metrics, shipped to the web side inside every snapshot.

``collect()`` returns ``{name: {"type", "help", "samples": [[labels, value], ...]}}``; histograms
carry ``{"buckets": [[le, cumulative_count], ...], "sum", "count"}`` per label set instead of a
value (``le`` is a number, or the string ``"+Inf"`` for the last bucket, so the snapshot stays
plain JSON). The web process renders them on /metrics beside its own (``api/metrics.py``).

Two sources:

- ``WorkerMetrics.collect(worker)``: read from the live scheduler (lanes, queues, budgets)
  plus what the worker's hooks accumulate (``on_tick``: tokens fed, tick durations;
  ``on_finished``: finishes). Dispatches (queue wait) and first tokens (TTFT) are observed once
  per job, by whichever of ``collect()`` and ``on_finished()`` sees them first.
- ``families_from_snapshot(state)``: derived from a whole snapshot dict: the scheduler's
  counters (core, KV pool, queue reorders) and the KV pool's figures. ``all_families(state)``
  merges both; the web side calls it on the latest snapshot.

Every read of scheduler state that is newer than the core's first version uses a default, so
metrics are exported (as 0) before the feature behind them exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from scheduler.core.qos import QosClass, band_of
from scheduler.core.types import Job, TickPlan, TickResult

if TYPE_CHECKING:
    from .loop import EngineWorker

INF = float("inf")
TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, INF)
QUEUE_WAIT_BUCKETS_S = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, INF)
TICK_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, INF)

CLASSES = tuple(c.label for c in QosClass)
BANDS = ("interactive", "normal", "batch")

# scheduler counter key -> (metric name, labels, help); a missing key exports 0
COUNTER_FAMILIES: dict[str, tuple[str, dict[str, str], str]] = {
    "admitted": ("superfluid_admitted_total", {}, "Jobs admitted into a lane for the first time."),
    "finished": ("superfluid_finished_total", {}, "Jobs finished for any reason (stop, length, cancelled, error)."),
    "cancelled": ("superfluid_cancelled_total", {}, "Jobs cancelled (client disconnect or explicit cancel)."),
    "preemptions": ("superfluid_preemptions_total", {}, "Running lanes preempted for a more urgent class."),
    "ticks": ("superfluid_ticks_total", {}, "Ticks executed by the engine."),
    "prefix_hits": ("superfluid_prefix_cache_hits_total", {}, "Admissions seeded from the prefix cache."),
    "prefix_tokens_reused": ("superfluid_prefix_cache_tokens_reused_total", {}, "Prompt tokens not prefilled thanks to the prefix cache."),
    "parks": ("superfluid_parks_total", {}, "Lanes whose KV was parked to host memory on preemption."),
    "resumes": ("superfluid_resumes_total", {}, "Parked jobs restored into a lane."),
    "evictions": ("superfluid_evictions_total", {}, "Cached prefixes evicted from the KV pool."),
    "host_imports": ("superfluid_host_imports_total", {}, "Prefixes imported back from host memory."),
    "host_drops": ("superfluid_host_drops_total", {}, "Prefixes dropped from host memory (OS pressure or the host cache bound)."),
    "stored": ("superfluid_prefix_cache_stored_total", {}, "Prefixes stored into the prefix cache."),
    "deadline_expired": ("superfluid_deadline_expired_total", {}, "Queued jobs finished because their start deadline passed."),
    "plans_rejected": ("superfluid_plans_rejected_total", {}, "Tick plans the engine could not hold (replanned with pins released)."),
}
OS_PRESSURE_KEYS = {"warning": "os_pressure_warning", "critical": "os_pressure_critical"}
REORDER_KEYS = {"aging": "reorders_aging", "swap_affinity": "reorders_swap_affinity"}

# snapshot["pool"] key -> (metric name, help)
POOL_GAUGES: dict[str, tuple[str, str]] = {
    "blocks_used": ("superfluid_pool_blocks_used", "KV pool blocks in use (live lanes, cached and pinned prefixes)."),
    "blocks_total": ("superfluid_pool_blocks_total", "KV pool blocks in all."),
    "cached_blocks": ("superfluid_pool_blocks_cached", "KV pool blocks holding cached prefixes."),
    "pinned_blocks": ("superfluid_pool_blocks_pinned", "KV pool blocks holding pinned prefixes."),
    "host_prefixes": ("superfluid_pool_host_prefixes", "Prefixes held in host memory after eviction."),
    "host_bytes": ("superfluid_pool_host_bytes", "Bytes of KV held in host memory (evicted prefixes)."),
    "device_prefixes": ("superfluid_pool_device_prefixes", "Cached prefixes held in the KV pool."),
}


def _le(bound: float) -> float | str:
    return "+Inf" if bound == INF else bound


class Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        value = max(0.0, value)
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1

    def export(self) -> dict[str, Any]:
        return {"buckets": [[_le(b), c] for b, c in zip(self.bounds, self.counts)], "sum": round(self.sum, 6), "count": self.count}


def family(kind: str, help_: str, samples: Iterable[tuple[Mapping[str, str], Any]]) -> dict[str, Any]:
    return {"type": kind, "help": help_, "samples": [[dict(labels), value] for labels, value in samples]}


class WorkerMetrics:
    def __init__(self) -> None:
        self.ttft = {c: Histogram(TTFT_BUCKETS_S) for c in CLASSES}
        self.queue_wait = {c: Histogram(QUEUE_WAIT_BUCKETS_S) for c in CLASSES}
        self.tick_seconds = Histogram(TICK_BUCKETS_S)
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.stopped_early = 0
        self.finishes: dict[tuple[str, str], int] = {}
        self.dispatched = {b: 0 for b in BANDS}
        self._dispatched_ids: set[str] = set()  # dispatched and not finished yet
        self._ttft_ids: set[str] = set()  # first token observed and not finished yet
        self.last_tick: dict[str, Any] = {"tick": 0, "prefill_tokens": 0, "decode_tokens": 0, "lanes": 0, "seconds": 0.0}

    # -- hooks (called by the worker) ---------------------------------------------------

    def on_tick(self, plan: TickPlan, result: TickResult) -> None:
        decode_lanes = {f.lane for f in plan.feeds if f.is_decode}
        decode = sum(n for lane, n in result.fed.items() if lane in decode_lanes)
        prefill = sum(n for lane, n in result.fed.items() if lane not in decode_lanes)
        self.decode_tokens += decode
        self.prefill_tokens += prefill
        if result.stopped_early:
            self.stopped_early += 1
        self.tick_seconds.observe(result.elapsed_s)
        self.last_tick = {
            "tick": plan.tick,
            "prefill_tokens": prefill,
            "decode_tokens": decode,
            "lanes": len({f.lane for f in plan.feeds}),
            "seconds": round(result.elapsed_s, 4),
        }

    def on_finished(self, job: Job, reason: str | None) -> None:
        self._note_dispatch(job)
        self._note_first_token(job)
        self._dispatched_ids.discard(job.job_id)
        self._ttft_ids.discard(job.job_id)
        key = (job.qos.label, reason or "unknown")
        self.finishes[key] = self.finishes.get(key, 0) + 1

    def _note_dispatch(self, job: Job) -> None:
        """Count a job once, the first time it is seen admitted (in collect() or at its finish)."""
        if job.admitted_s is None or job.job_id in self._dispatched_ids:
            return
        self._dispatched_ids.add(job.job_id)
        self.dispatched[band_of(job.priority)] += 1
        self.queue_wait[job.qos.label].observe(job.admitted_s - job.arrival_s)

    def _note_first_token(self, job: Job) -> None:
        """Observe a job's time to first token once, as soon as it is seen (not only at its end)."""
        if job.first_token_s is None or job.job_id in self._ttft_ids:
            return
        self._ttft_ids.add(job.job_id)
        self.ttft[job.qos.label].observe(job.first_token_s - job.arrival_s)

    # -- export -------------------------------------------------------------------------

    def collect(self, worker: EngineWorker) -> dict[str, Any]:
        sched = worker.scheduler
        now = worker.clock()
        for job in list(sched.jobs.values()):
            self._note_dispatch(job)
            self._note_first_token(job)
        lanes = list(sched.lanes)
        queued = list(sched.queues)
        out: dict[str, Any] = {}

        # lanes
        states = {"idle": 0, "prefill": 0, "decode": 0}
        for job in lanes:
            states["idle" if job is None else "prefill" if job.prefilling else "decode"] += 1
        out["superfluid_lanes_active"] = family("gauge", "Lanes holding a job.", [({}, len(lanes) - states["idle"])])
        out["superfluid_lanes_total"] = family("gauge", "Lanes (--max-batch).", [({}, len(lanes))])
        out["superfluid_lanes"] = family("gauge", "Lanes by state.", [({"state": s}, n) for s, n in states.items()])
        out["superfluid_lanes_by_class"] = family(
            "gauge", "Busy lanes by QoS class.", [({"class": c}, sum(1 for j in lanes if j is not None and j.qos.label == c)) for c in CLASSES]
        )
        out["superfluid_jobs_parked"] = family(
            "gauge", "Preempted jobs waiting with their KV parked.", [({}, sum(1 for j in queued if j.parked is not None))]
        )

        # queues, by class and by band
        by_class = {c: [j for j in queued if j.qos.label == c] for c in CLASSES}
        by_band: dict[str, list[Job]] = {b: [] for b in BANDS}
        for job in queued:
            by_band[band_of(job.priority)].append(job)

        def oldest(jobs: list[Job]) -> float:
            return round(max((now - j.arrival_s for j in jobs), default=0.0), 3)

        out["superfluid_queue_depth"] = family("gauge", "Jobs waiting for a lane, by QoS class.", [({"class": c}, len(js)) for c, js in by_class.items()])
        out["superfluid_queue_oldest_wait_seconds"] = family(
            "gauge", "How long the longest-waiting job of each class has waited.", [({"class": c}, oldest(js)) for c, js in by_class.items()]
        )
        out["llamaswap_scheduler_queue_depth"] = family("gauge", "Requests waiting, by priority band.", [({"band": b}, len(js)) for b, js in by_band.items()])
        out["llamaswap_scheduler_queue_oldest_wait_seconds"] = family(
            "gauge", "How long the longest-waiting request of each band has waited.", [({"band": b}, oldest(js)) for b, js in by_band.items()]
        )
        out["llamaswap_scheduler_dispatched_total"] = family(
            "counter", "Requests dispatched (admitted into a lane), by priority band.", [({"band": b}, n) for b, n in self.dispatched.items()]
        )

        # budgets
        budget, step = _prefill_budget(worker)
        decoding = states["decode"]
        grant = min(sched.config.tick_decode_budget or decoding, decoding)
        out["superfluid_prefill_budget_tokens"] = family("gauge", "Prompt tokens a tick may prefill, as last planned (live budget).", [({}, budget)])
        out["superfluid_prefill_step_tokens"] = family("gauge", "Most tokens per engine call while prefilling.", [({}, step)])
        out["superfluid_decode_grant_tokens"] = family("gauge", "Decode tokens the next tick grants (one per decoding lane, up to --tick-decode-budget).", [({}, grant)])
        out["superfluid_prefill_tokens_per_second"] = family("gauge", "Measured prefill rate the budget is sized from.", [({}, round(float(sched.prefill_tokens_per_s), 1))])
        out["superfluid_tick"] = family("gauge", "Number of the last tick planned.", [({}, sched.tick)])
        out["superfluid_last_tick_tokens"] = family(
            "gauge", "Tokens the last executed tick fed, by kind.", [({"kind": "prefill"}, self.last_tick["prefill_tokens"]), ({"kind": "decode"}, self.last_tick["decode_tokens"])]
        )
        out["superfluid_last_tick_lanes"] = family("gauge", "Lanes fed by the last executed tick.", [({}, self.last_tick["lanes"])])
        out["superfluid_last_tick_seconds"] = family("gauge", "Duration of the last executed tick.", [({}, self.last_tick["seconds"])])

        # counters kept by this object and the worker
        stats = worker.stats
        out["superfluid_prefill_tokens_total"] = family("counter", "Prompt tokens fed to the engine (prefill, including recompute).", [({}, self.prefill_tokens)])
        out["superfluid_decode_tokens_total"] = family("counter", "Decode tokens fed to the engine.", [({}, self.decode_tokens)])
        out["superfluid_prompt_tokens_total"] = family("counter", "Prompt tokens of finished requests.", [({}, int(stats.get("prompt_tokens_total", 0)))])
        out["superfluid_completion_tokens_total"] = family("counter", "Completion tokens of finished requests.", [({}, int(stats.get("completion_tokens_total", 0)))])
        out["superfluid_worker_requests_total"] = family("counter", "Jobs the worker accepted into its queues.", [({}, int(stats.get("requests_total", 0)))])
        out["superfluid_worker_rejected_total"] = family("counter", "Jobs the worker rejected (context too long, draining, ...).", [({}, int(stats.get("rejected_total", 0)))])
        out["superfluid_engine_errors_total"] = family("counter", "Ticks that failed in the engine.", [({}, int(stats.get("engine_errors_total", 0)))])
        out["superfluid_ticks_stopped_early_total"] = family("counter", "Ticks interrupted at an engine step (cancel or urgent arrival).", [({}, self.stopped_early)])
        out["superfluid_jobs_finished_total"] = family(
            "counter", "Finished jobs by class and finish reason.", [({"class": c, "reason": r}, n) for (c, r), n in sorted(self.finishes.items())]
        )

        # histograms
        out["superfluid_ttft_seconds"] = family("histogram", "Time from arrival to first token, by QoS class.", [({"class": c}, h.export()) for c, h in self.ttft.items()])
        out["superfluid_queue_wait_seconds"] = family(
            "histogram", "Time from arrival to admission into a lane, by QoS class.", [({"class": c}, h.export()) for c, h in self.queue_wait.items()]
        )
        out["superfluid_tick_duration_seconds"] = family("histogram", "Duration of executed ticks.", [({}, self.tick_seconds.export())])
        return out


def _prefill_budget(worker: EngineWorker) -> tuple[int, int]:
    """(prompt tokens the last planned tick could prefill, tokens per engine call)."""
    budget, step = worker.scheduler.prefill_cap
    return int(budget), int(step)


def families_from_snapshot(state: Mapping[str, Any]) -> dict[str, Any]:
    """Families derived from a whole worker snapshot: the scheduler's counters (``state["counters"]``,
    which merges the core's, the KV pool's and the queues' reorder counts) and the KV pool
    (``state["pool"]``). A counter or pool figure the snapshot lacks is exported as 0; the
    per-band dispatch counters only when the snapshot has them (``collect()`` counts them
    otherwise)."""
    counters: Mapping[str, Any] = state.get("counters") or {}
    pool: Mapping[str, Any] = state.get("pool") or {}
    out: dict[str, Any] = {}
    for key, (name, labels, help_) in COUNTER_FAMILIES.items():
        out[name] = family("counter", help_, [(labels, counters.get(key, 0) or 0)])
    out["superfluid_os_pressure_total"] = family(
        "counter", "OS memory-pressure events acted on, by level.", [({"level": lv}, counters.get(k, 0) or 0) for lv, k in OS_PRESSURE_KEYS.items()]
    )
    out["llamaswap_scheduler_reorders_total"] = family(
        "counter",
        "Dispatches where aging or swap affinity changed the pick.",
        [({"reason": r}, counters.get(k, 0) or 0) for r, k in REORDER_KEYS.items()],
    )
    if all(f"dispatched_{b}" in counters for b in BANDS):
        out["llamaswap_scheduler_dispatched_total"] = family(
            "counter", "Requests dispatched (admitted into a lane), by priority band.", [({"band": b}, counters[f"dispatched_{b}"]) for b in BANDS]
        )
    for key, (name, help_) in POOL_GAUGES.items():
        out[name] = family("gauge", help_, [({}, pool.get(key, 0) or 0)])
    return out


def all_families(state: Mapping[str, Any]) -> dict[str, Any]:
    """Everything a snapshot says, as families: ``state["metrics"]`` (``collect()``) overlaid
    with what is derived from the snapshot itself."""
    out: dict[str, Any] = dict(state.get("metrics") or {})
    out.update(families_from_snapshot(state))
    return out
