"""The engine worker's statistics, shipped to the web side inside every snapshot.

``WorkerMetrics.collect(scheduler, worker_stats)`` returns a :class:`WorkerStats`: plain numbers
and dicts (JSON as it is, no metric names, no Prometheus shapes). The web process names them and
turns them into Prometheus families on /metrics (``api/metrics.py``); the dashboard reads the
same fields (``dashboard/feed.py``).

Two sources:

- the live scheduler (lanes, queues, budgets), read at each ``collect()``;
- what the worker's hooks accumulate (``on_tick``: tokens fed, tick durations; ``on_finished``:
  finishes). Queue waits and first tokens (TTFT) are observed once per job, by whichever of
  ``collect()`` and ``on_finished()`` sees them first.

The scheduler's own counters (admissions, dispatches per band, preemptions, the KV pool's) are in
the snapshot already (``snapshot["counters"]``) and are not repeated here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from scheduler.core.qos import QosClass, band_of
from scheduler.core.scheduler import Scheduler
from scheduler.core.types import Job, TickPlan, TickResult

TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
QUEUE_WAIT_BUCKETS_S = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
TICK_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
# jobs whose link dropped, remembered (their queue wait and first token observed) for a
# resubmission under the same id; the oldest forgotten past this many (never submitted again)
DROPPED_IDS = 4096

CLASSES = tuple(c.label for c in QosClass)
BANDS = ("interactive", "normal", "batch")


class HistogramStats(TypedDict):
    """Observations of one histogram. ``le`` are the finite upper bounds, ``buckets`` the
    cumulative count at each; ``count`` is the implicit +Inf bucket (JSON has no infinity)."""

    le: list[float]
    buckets: list[int]
    sum: float
    count: int


class LastTick(TypedDict):
    tick: int
    prefill_tokens: int
    decode_tokens: int
    lanes: int
    seconds: float


class WorkerStats(TypedDict):
    """One snapshot's statistics (``snapshot["metrics"]``)."""

    lanes_total: int  # --max-batch
    lanes_by_state: dict[str, int]  # idle, prefill, decode
    lanes_by_class: dict[str, int]  # busy lanes per QoS class
    jobs_parked: int  # preempted jobs waiting with their KV parked
    queue_depth_by_class: dict[str, int]
    queue_oldest_wait_s_by_class: dict[str, float]
    queue_depth_by_band: dict[str, int]
    queue_oldest_wait_s_by_band: dict[str, float]
    prefill_budget_tokens: int  # prompt tokens the last planned tick could prefill
    prefill_step_tokens: int  # most tokens per engine call while prefilling
    decode_grant_tokens: int  # decode tokens a round grants, as last planned
    prefill_tokens_per_s: float  # measured prefill rate the budget is sized from
    tick: int  # the last tick planned
    last_tick: LastTick  # the last tick executed
    prefill_tokens_total: int  # prompt tokens fed to the engine, recompute included
    decode_tokens_total: int
    prompt_tokens_total: int  # of finished requests
    completion_tokens_total: int
    requests_total: int  # jobs accepted into the queues
    rejected_total: int
    engine_errors_total: int
    ticks_stopped_early_total: int
    finished: dict[str, dict[str, int]]  # class -> finish reason -> jobs
    ttft_s: dict[str, HistogramStats]  # per class
    queue_wait_s: dict[str, HistogramStats]  # per class
    tick_duration_s: HistogramStats


class Histogram:
    """Counts per bucket, with a sum and a count: the worker's only accumulating shape."""

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

    def stats(self) -> HistogramStats:
        return {"le": list(self.bounds), "buckets": list(self.counts), "sum": round(self.sum, 6), "count": self.count}


class WorkerMetrics:
    def __init__(self) -> None:
        self.ttft = {c: Histogram(TTFT_BUCKETS_S) for c in CLASSES}
        self.queue_wait = {c: Histogram(QUEUE_WAIT_BUCKETS_S) for c in CLASSES}
        self.tick_seconds = Histogram(TICK_BUCKETS_S)
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.stopped_early = 0
        self.finishes: dict[str, dict[str, int]] = {}
        self._waited_ids: set[str] = set()  # queue wait observed and not finished yet
        self._ttft_ids: set[str] = set()  # first token observed and not finished yet
        self._dropped: dict[str, None] = {}  # their link dropped and not submitted again yet (insertion order)
        self.last_tick: LastTick = {"tick": 0, "prefill_tokens": 0, "decode_tokens": 0, "lanes": 0, "seconds": 0.0}

    # -- hooks (called by the worker) ---------------------------------------------------

    def on_fed(self, plan: TickPlan, result: TickResult) -> tuple[int, int]:
        """Count the tokens a tick fed the engine, (prefill, decode): also for a tick the engine
        refused part way, whose steps before the refused one are committed like any tick's."""
        decode_lanes = {f.lane for f in plan.feeds if f.is_decode}
        decode = sum(n for lane, n in result.fed.items() if lane in decode_lanes)
        prefill = sum(n for lane, n in result.fed.items() if lane not in decode_lanes)
        self.decode_tokens += decode
        self.prefill_tokens += prefill
        return prefill, decode

    def on_tick(self, plan: TickPlan, result: TickResult) -> None:
        prefill, decode = self.on_fed(plan, result)
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
        self._note_queue_wait(job)
        self._note_first_token(job)
        self._waited_ids.discard(job.job_id)
        self._ttft_ids.discard(job.job_id)
        by_reason = self.finishes.setdefault(job.qos.label, {})
        by_reason[reason or "unknown"] = by_reason.get(reason or "unknown", 0) + 1

    def on_dropped(self, job: Job) -> None:
        """A job ended because its link dropped: not a finish (its web side submits it again under
        its id, and that job's finish counts the request), so its observed wait and first token
        stay remembered for the resubmission, but only for the DROPPED_IDS latest such jobs: one
        never submitted again (its web side went away) is forgotten, and never counted finished."""
        self._note_queue_wait(job)
        self._note_first_token(job)
        self._dropped[job.job_id] = None
        while len(self._dropped) > DROPPED_IDS:
            oldest = next(iter(self._dropped))
            del self._dropped[oldest]
            self._waited_ids.discard(oldest)
            self._ttft_ids.discard(oldest)

    def on_queued(self, job_id: str) -> None:
        """A job accepted into the queues: one submitted again after its link dropped is live
        again, and its ids are released at its finish."""
        self._dropped.pop(job_id, None)

    def _note_queue_wait(self, job: Job) -> None:
        """Observe a job's queue wait once, the first time it is seen admitted (in collect() or at
        its finish). Dispatches themselves are the scheduler's counters (``dispatched_<band>``)."""
        if job.admitted_s is None or job.job_id in self._waited_ids:
            return
        self._waited_ids.add(job.job_id)
        self.queue_wait[job.qos.label].observe(job.admitted_s - job.arrival_s)

    def _note_first_token(self, job: Job) -> None:
        """Observe a job's time to first token once, as soon as it is seen (not only at its end)."""
        if job.first_token_s is None or job.job_id in self._ttft_ids:
            return
        self._ttft_ids.add(job.job_id)
        self.ttft[job.qos.label].observe(job.first_token_s - job.arrival_s)

    # -- export -------------------------------------------------------------------------

    def collect(self, sched: Scheduler, worker_stats: Mapping[str, float]) -> WorkerStats:
        """The statistics of this moment: ``sched`` is the worker's scheduler, ``worker_stats``
        the worker's own counters (``EngineWorker.stats``)."""
        now = sched.clock()
        for job in list(sched.jobs.values()):
            self._note_queue_wait(job)
            self._note_first_token(job)
        lanes = list(sched.lanes)
        queued = list(sched.queues)

        states = {"idle": 0, "prefill": 0, "decode": 0}
        for lane in lanes:
            states["idle" if lane is None else "prefill" if lane.prefilling else "decode"] += 1
        by_class: dict[str, list[Job]] = {c: [] for c in CLASSES}
        by_band: dict[str, list[Job]] = {b: [] for b in BANDS}
        for job in queued:
            by_class[job.qos.label].append(job)
            by_band[band_of(job.priority)].append(job)

        def oldest(jobs: list[Job]) -> float:
            # a job never admitted: since its arrival, its wait before this worker (the router's,
            # the Redis queue's, for the worker to connect) included, as its queue wait counts it;
            # a preempted job: since it joined the queue again (not the time it ran)
            return round(max((now - (j.arrival_s if j.admitted_s is None else j.enqueued_s) for j in jobs), default=0.0), 3)

        budget, step = sched.prefill_cap
        decoding = states["decode"]
        return {
            "lanes_total": len(lanes),
            "lanes_by_state": states,
            "lanes_by_class": {c: sum(1 for j in lanes if j is not None and j.qos.label == c) for c in CLASSES},
            "jobs_parked": sum(1 for j in queued if j.parked is not None),
            "queue_depth_by_class": {c: len(js) for c, js in by_class.items()},
            "queue_oldest_wait_s_by_class": {c: oldest(js) for c, js in by_class.items()},
            # requests (the seed's), the choices of one counted once
            "queue_depth_by_band": {b: len({j.request_of or j.job_id for j in js}) for b, js in by_band.items()},
            "queue_oldest_wait_s_by_band": {b: oldest(js) for b, js in by_band.items()},
            "prefill_budget_tokens": int(budget),
            "prefill_step_tokens": int(step),
            "decode_grant_tokens": min(sched.config.tick_decode_budget or decoding, decoding),
            "prefill_tokens_per_s": round(float(sched.prefill_tokens_per_s), 1),
            "tick": sched.tick,
            "last_tick": self.last_tick.copy(),
            "prefill_tokens_total": self.prefill_tokens,
            "decode_tokens_total": self.decode_tokens,
            "prompt_tokens_total": int(worker_stats.get("prompt_tokens_total", 0)),
            "completion_tokens_total": int(worker_stats.get("completion_tokens_total", 0)),
            "requests_total": int(worker_stats.get("requests_total", 0)),
            "rejected_total": int(worker_stats.get("rejected_total", 0)),
            "engine_errors_total": int(worker_stats.get("engine_errors_total", 0)),
            "ticks_stopped_early_total": self.stopped_early,
            "finished": {c: dict(reasons) for c, reasons in sorted(self.finishes.items())},
            "ttft_s": {c: h.stats() for c, h in self.ttft.items()},
            "queue_wait_s": {c: h.stats() for c, h in self.queue_wait.items()},
            "tick_duration_s": self.tick_seconds.stats(),
        }
