"""GET /metrics: Prometheus text format for the web process and the engine worker, on one port.

prometheus_client renders everything from its default registry:

1. django-prometheus's metrics (``django_http_*``: the Django views' requests, responses and
   latencies; the process collector);
2. :class:`SuperfluidCollector`, registered once, which names what superfluid knows:

   - the engine worker's statistics from its latest snapshot (``snapshot["metrics"]``, a
     :class:`~scheduler.worker.metrics.WorkerStats`), its scheduler counters
     (``snapshot["counters"]``) and KV pool figures (``snapshot["pool"]``); in Redis mode the
     fleet (``snapshot["fleet"]``, ``snapshot["global_queue"]``: ``superfluid_fleet_*`` and
     ``superfluid_global_queue_depth``);
   - the link (is the worker connected, how often it restarted, requests in flight);
   - the web side's generation counters (:class:`WebMetrics`), filled from each request's
     record when its response ends: per endpoint and status, and per API key;
   - with several models (serve --config), the router's figures (scheduler/link/pool.py's
     ``router_stats()``): ``llamaswap_scheduler_*`` across every model, in place of the one
     worker's, and ``superfluid_model_loads_total``, ``superfluid_model_load_seconds``,
     ``superfluid_model_state``.

A non-admin key sees only its own per-key series: :class:`KeyView` wraps the registry and filters
the families labelled ``key`` (and, for a policy that lists its models, those labelled by a model
it may not use). The metric names, labels and help texts are the interface (the
seeds and docs/operations.md list them); the worker ships plain numbers and never names a metric.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from django.http import HttpRequest, HttpResponse
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from keys.snapshot import ANONYMOUS_KEY_NAME as ANONYMOUS_KEY  # the key label of keyless requests
from scheduler.worker.metrics import BANDS, CLASSES, Histogram, HistogramStats

from .admission import key_required

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
DURATION_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
LANE_STATES = ("idle", "prefill", "decode")
LABEL_VALUES: dict[str, tuple[str, ...]] = {"state": LANE_STATES, "class": CLASSES, "band": BANDS}  # every sample a label has


# -- families from plain numbers ------------------------------------------------------------


def gauge(name: str, help_: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_, value=value)


def counter(name: str, help_: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_, value=value)


def labelled(family: type[GaugeMetricFamily | CounterMetricFamily], name: str, help_: str, labels: Iterable[str], rows: Iterable[tuple[Iterable[str], float]]) -> Metric:
    fam = family(name, help_, labels=list(labels))
    for values, value in rows:
        fam.add_metric(list(values), value)
    return fam


def histogram(name: str, help_: str, label: str | None, series: Mapping[str, HistogramStats]) -> HistogramMetricFamily:
    """``series`` maps a label value to its observations (one series, key "", when ``label`` is None)."""
    fam = HistogramMetricFamily(name, help_, labels=[label] if label else [])
    for value, h in series.items():
        buckets: list[tuple[str, float]] = [(floatToGoString(le), n) for le, n in zip(h["le"], h["buckets"], strict=True)]
        buckets.append(("+Inf", h["count"]))
        fam.add_metric([value] if label else [], buckets, h["sum"])
    return fam


def _per(keys: Iterable[str], table: Mapping[str, float] | None) -> list[tuple[list[str], float]]:
    table = table or {}
    return [([k], table.get(k, 0) or 0) for k in keys]


def gauges_by_label(table: Mapping[str, tuple[str, str, str]], stats: Mapping[str, Any]) -> Iterator[Metric]:
    """A gauge for each row of ``table`` (field of ``stats`` -> (metric name, help, label)), with a
    sample for each of the label's values (LABEL_VALUES), 0 where the field has none."""
    for field, (name, help_, label) in table.items():
        yield labelled(GaugeMetricFamily, name, help_, [label], _per(LABEL_VALUES[label], stats.get(field)))


# -- the worker's snapshot --------------------------------------------------------------------

# (snapshot part, key) -> (family, metric name, help): one unlabelled sample each, 0 where the key
# is missing. The parts: "metrics" (the worker's WorkerStats), "counters" (the scheduler core's, the
# KV pool's and the queues' counters), "pool" (the KV pool's figures).
SCALARS: dict[tuple[str, str], tuple[Callable[[str, str, float], Metric], str, str]] = {
    ("metrics", "lanes_total"): (gauge, "superfluid_lanes_total", "Lanes (--max-batch)."),
    ("metrics", "jobs_parked"): (gauge, "superfluid_jobs_parked", "Preempted jobs waiting with their KV parked."),
    ("metrics", "prefill_budget_tokens"): (gauge, "superfluid_prefill_budget_tokens", "Prompt tokens a tick may prefill, as last planned (live budget)."),
    ("metrics", "prefill_step_tokens"): (gauge, "superfluid_prefill_step_tokens", "Most tokens per engine call while prefilling."),
    ("metrics", "decode_grant_tokens"): (gauge, "superfluid_decode_grant_tokens", "Decode tokens a decode round grants (one per decoding lane, up to --tick-decode-budget), as last planned."),
    ("metrics", "prefill_tokens_per_s"): (gauge, "superfluid_prefill_tokens_per_second", "Measured prefill rate the budget is sized from."),
    ("metrics", "tick"): (gauge, "superfluid_tick", "Number of the last tick planned."),
    ("metrics", "prefill_tokens_total"): (counter, "superfluid_prefill_tokens_total", "Prompt tokens fed to the engine (prefill, including recompute)."),
    ("metrics", "decode_tokens_total"): (counter, "superfluid_decode_tokens_total", "Decode tokens fed to the engine."),
    ("metrics", "prompt_tokens_total"): (counter, "superfluid_prompt_tokens_total", "Prompt tokens of finished requests."),
    ("metrics", "completion_tokens_total"): (counter, "superfluid_completion_tokens_total", "Completion tokens of finished requests."),
    ("metrics", "requests_total"): (counter, "superfluid_worker_requests_total", "Jobs the worker accepted into its queues."),
    ("metrics", "rejected_total"): (counter, "superfluid_worker_rejected_total", "Jobs the worker rejected (context too long, draining, ...)."),
    ("metrics", "engine_errors_total"): (counter, "superfluid_engine_errors_total", "Ticks that failed in the engine."),
    ("metrics", "ticks_stopped_early_total"): (counter, "superfluid_ticks_stopped_early_total", "Ticks interrupted at an engine step (cancel or urgent arrival)."),
    ("counters", "admitted"): (counter, "superfluid_admitted_total", "Jobs admitted into a lane for the first time."),
    ("counters", "finished"): (counter, "superfluid_finished_total", "Jobs finished for any reason (stop, length, cancelled, error)."),
    ("counters", "cancelled"): (counter, "superfluid_cancelled_total", "Jobs cancelled (client disconnect or explicit cancel)."),
    ("counters", "preemptions"): (counter, "superfluid_preemptions_total", "Running lanes preempted for a more urgent class."),
    ("counters", "ticks"): (counter, "superfluid_ticks_total", "Ticks executed by the engine."),
    ("counters", "prefix_hits"): (counter, "superfluid_prefix_cache_hits_total", "Admissions seeded from the prefix cache."),
    ("counters", "prefix_tokens_reused"): (counter, "superfluid_prefix_cache_tokens_reused_total", "Prompt tokens not prefilled thanks to the prefix cache."),
    ("counters", "parks"): (counter, "superfluid_parks_total", "Lanes whose KV was parked to host memory on preemption."),
    ("counters", "resumes"): (counter, "superfluid_resumes_total", "Parked jobs restored into a lane."),
    ("counters", "lane_moves"): (counter, "superfluid_lane_moves_total", "Running jobs moved into a free lane below them, so busy lanes run in one pass (llama.cpp)."),
    ("counters", "evictions"): (counter, "superfluid_evictions_total", "Cached prefixes evicted from the KV pool."),
    ("counters", "host_imports"): (counter, "superfluid_host_imports_total", "Prefixes imported back from host memory."),
    ("counters", "host_drops"): (counter, "superfluid_host_drops_total", "Prefixes dropped from host memory (OS pressure or the host cache bound)."),
    ("counters", "stored"): (counter, "superfluid_prefix_cache_stored_total", "Prefixes stored into the prefix cache."),
    ("counters", "deadline_expired"): (counter, "superfluid_deadline_expired_total", "Queued jobs finished because their start deadline passed."),
    ("counters", "plans_rejected"): (counter, "superfluid_plans_rejected_total", "Tick plans the engine could not hold (replanned with pins released)."),
    ("pool", "blocks_used"): (gauge, "superfluid_pool_blocks_used", "KV pool blocks in use (live lanes, kept lanes where their KV is memory of its own, cached and pinned prefixes)."),
    ("pool", "blocks_total"): (gauge, "superfluid_pool_blocks_total", "KV pool blocks in all."),
    ("pool", "cached_blocks"): (gauge, "superfluid_pool_blocks_cached", "KV pool blocks holding cached prefixes."),
    ("pool", "pinned_blocks"): (gauge, "superfluid_pool_blocks_pinned", "KV pool blocks holding pinned prefixes."),
    ("pool", "host_prefixes"): (gauge, "superfluid_pool_host_prefixes", "Prefixes held in host memory after eviction."),
    ("pool", "host_bytes"): (gauge, "superfluid_pool_host_bytes", "Bytes of KV held in host memory (evicted prefixes)."),
    ("pool", "device_prefixes"): (gauge, "superfluid_pool_device_prefixes", "Cached prefixes held in the KV pool."),
}
# metric name -> (help, label, {label value: snapshot["counters"] key}); a missing key exports 0
LABELLED_COUNTERS: dict[str, tuple[str, str, dict[str, str]]] = {
    "llamaswap_scheduler_dispatched_total": ("Requests dispatched (admitted into a lane), by priority band.", "band", {b: f"dispatched_{b}" for b in BANDS}),
    "superfluid_os_pressure_total": ("OS memory-pressure events acted on, by level.", "level", {"warning": "os_pressure_warning", "critical": "os_pressure_critical"}),
    "llamaswap_scheduler_reorders_total": ("Dispatches where aging or swap affinity changed the pick.", "reason", {"aging": "reorders_aging", "swap_affinity": "reorders_swap_affinity"}),
}
# WorkerStats field -> (metric name, help, label): a gauge with a sample for each of the label's
# values (LABEL_VALUES), 0 where the field has none
WORKER_BY_LABEL: dict[str, tuple[str, str, str]] = {
    "lanes_by_state": ("superfluid_lanes", "Lanes by state.", "state"),
    "lanes_by_class": ("superfluid_lanes_by_class", "Busy lanes by QoS class.", "class"),
    "queue_depth_by_class": ("superfluid_queue_depth", "Jobs waiting for a lane, by QoS class.", "class"),
    "queue_oldest_wait_s_by_class": ("superfluid_queue_oldest_wait_seconds", "How long the longest-waiting job of each class has waited.", "class"),
    "queue_depth_by_band": ("llamaswap_scheduler_queue_depth", "Requests waiting, by priority band.", "band"),
    "queue_oldest_wait_s_by_band": ("llamaswap_scheduler_queue_oldest_wait_seconds", "How long the longest-waiting request of each band has waited.", "band"),
}


# the finish reasons a job can end with (scheduler/core/scheduler.py, the worker's loop): every
# class and reason has a sample from the start, 0 until one finishes so, so that rate() and
# increase() over them answer 0 rather than nothing before the first finish
FINISH_REASONS = ("stop", "length", "cancelled", "error", "deadline")


def finished_by_class_and_reason(finished: Mapping[str, Mapping[str, int]]) -> dict[tuple[str, str], int]:
    """Every class and known finish reason (0 where none finished so), and any other seen."""
    counts = {(c, r): 0 for c in CLASSES for r in FINISH_REASONS}
    for c, reasons in finished.items():
        for r, n in reasons.items():
            counts[(c, r)] = n
    return counts


def last_tick_families(ticks: list[tuple[list[str], Mapping[str, Any]]], labels: list[str]) -> Iterator[Metric]:
    """``superfluid_last_tick_*``: a sample for each (label values, its ``last_tick``) of ``ticks``."""
    yield labelled(
        GaugeMetricFamily,
        "superfluid_last_tick_tokens",
        "Tokens the last executed tick fed, by kind.",
        [*labels, "kind"],
        [([*who, kind], last.get(f"{kind}_tokens", 0)) for who, last in ticks for kind in ("prefill", "decode")],
    )
    yield labelled(GaugeMetricFamily, "superfluid_last_tick_lanes", "Lanes fed by the last executed tick.", labels, [(who, last.get("lanes", 0)) for who, last in ticks])
    yield labelled(GaugeMetricFamily, "superfluid_last_tick_seconds", "Duration of the last executed tick.", labels, [(who, last.get("seconds", 0.0)) for who, last in ticks])


def worker_families(stats: Mapping[str, Any], fleet: list[Mapping[str, Any]] | None = None) -> Iterator[Metric]:
    """The families of one snapshot's ``metrics`` (a WorkerStats) beyond its plain numbers (those
    are in SCALARS); a missing field exports 0. ``fleet`` (Redis mode: each worker's entry of the
    snapshot's ``fleet``): the last tick is each worker's, labelled with its ``worker`` and
    ``host`` as the other families of one worker of a fleet are, not one worker's unnamed."""
    states: Mapping[str, int] = stats.get("lanes_by_state") or {}
    yield gauge("superfluid_lanes_active", "Lanes holding a job.", int(stats.get("lanes_total", 0)) - states.get("idle", 0))
    yield from gauges_by_label(WORKER_BY_LABEL, stats)
    if fleet is None:
        yield from last_tick_families([([], stats.get("last_tick") or {})], [])
    else:
        ticks = [([str(w.get("worker", "")), str(w.get("host", ""))], w.get("last_tick") or {}) for w in fleet]
        yield from last_tick_families(ticks, ["worker", "host"])
    finished: Mapping[str, Mapping[str, int]] = stats.get("finished") or {}
    yield labelled(
        CounterMetricFamily,
        "superfluid_jobs_finished_total",
        "Finished jobs by class and finish reason.",
        ["class", "reason"],
        [([c, r], n) for (c, r), n in sorted(finished_by_class_and_reason(finished).items())],
    )
    yield histogram("superfluid_ttft_seconds", "Time from arrival to first token, by QoS class.", "class", stats.get("ttft_s") or {})
    yield histogram("superfluid_queue_wait_seconds", "Time from arrival to admission into a lane, by QoS class.", "class", stats.get("queue_wait_s") or {})
    tick = stats.get("tick_duration_s")
    yield histogram("superfluid_tick_duration_seconds", "Duration of executed ticks.", None, {"": tick} if tick else {})


def snapshot_families(state: Mapping[str, Any]) -> Iterator[Metric]:
    """Every family one worker snapshot gives: its statistics, the scheduler's counters (the
    core's, the KV pool's and the queues' reorder counts) and the KV pool's figures."""
    for (part, key), (family, name, help_) in SCALARS.items():
        yield family(name, help_, (state.get(part) or {}).get(key, 0) or 0)
    fleet = [w for w in state.get("fleet") or [] if isinstance(w, Mapping)] if "fleet" in state else None
    yield from worker_families(state.get("metrics") or {}, fleet)
    yield class_lane_caps(state)
    counters: Mapping[str, Any] = state.get("counters") or {}
    for name, (help_, label, keys) in LABELLED_COUNTERS.items():
        yield labelled(CounterMetricFamily, name, help_, [label], [([v], counters.get(k, 0) or 0) for v, k in keys.items()])
    yield from fleet_families(state)


def class_lane_caps(state: Mapping[str, Any]) -> Metric:
    """``superfluid_class_lane_cap{class}``: the most lanes each class may hold, its cap in force
    (the snapshot's ``class_lanes``: the admin's, else --class-lanes; a fleet's, each worker's
    added) or, where it has none, every lane. Beside ``superfluid_lanes_by_class`` and
    ``superfluid_queue_depth`` it tells a wait on the class's cap (lanes idle, the class at its
    cap, its jobs queued) from a wait for a lane, which /metrics could not tell apart before."""
    lanes = (state.get("metrics") or {}).get("lanes_total", 0) or 0
    caps = state.get("class_lanes")
    caps = caps if isinstance(caps, Mapping) else {}
    return labelled(
        GaugeMetricFamily,
        "superfluid_class_lane_cap",
        "The most lanes each QoS class may hold: its class-lane cap in force (admin or --class-lanes), else every lane.",
        ["class"],
        [([c], _cap(caps.get(c), lanes)) for c in CLASSES],
    )


def _cap(cap: Any, lanes: float) -> float:
    """A class's cap as the worker applies it: within its lanes; none (or not a number) is all of them."""
    if not isinstance(cap, int | float) or isinstance(cap, bool):
        return lanes
    return min(cap, lanes) if lanes else cap


def fleet_families(state: Mapping[str, Any]) -> Iterator[Metric]:
    """Redis mode: the fleet (``snapshot["fleet"]``: each worker's id, host and lanes) and the
    global queue by class (``snapshot["global_queue"]``); nothing when the snapshot has no fleet
    (not Redis mode). A fleet with no worker left is 0 workers."""
    if "fleet" not in state:
        return
    fleet: list[Mapping[str, Any]] = list(state.get("fleet") or [])
    yield gauge("superfluid_fleet_workers", "Engine workers alive in the Redis fleet.", len(fleet))

    def who(w: Mapping[str, Any]) -> list[str]:
        return [str(w.get("worker", "")), str(w.get("host", ""))]

    yield labelled(
        GaugeMetricFamily,
        "superfluid_fleet_lanes_busy",
        "Busy lanes of each fleet worker.",
        ["worker", "host"],
        [(who(w), sum(1 for lane in w.get("lanes") or [] if lane.get("job_id"))) for w in fleet],
    )
    yield labelled(GaugeMetricFamily, "superfluid_fleet_lanes", "Lanes of each fleet worker.", ["worker", "host"], [(who(w), w.get("n_lanes", 0) or 0) for w in fleet])
    queue: Mapping[str, int] = state.get("global_queue") or {}
    yield labelled(GaugeMetricFamily, "superfluid_global_queue_depth", "Jobs waiting in the Redis queue, by class.", ["class"], [([c], n) for c, n in queue.items()])


# -- web-side counters, filled from request records -------------------------------------------


class Outcome(Protocol):
    """What the counters read of a finished request (``api.records.RequestRecord``)."""

    endpoint: str
    started_s: float
    key_name: str | None
    qos: str | None
    status: int
    error_code: str | None
    usage: dict[str, Any]


def is_rejection(record: Outcome) -> bool:
    """Refused rather than served: an error status, not a client that went away."""
    return record.status >= 400 and record.status != 499


class WebMetrics:
    """Counters of generation requests as the web side saw them (one update per response)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requests: dict[tuple[str, str], int] = {}  # (endpoint, status)
        self.durations: dict[str, Histogram] = {}  # endpoint
        self.key_requests: dict[tuple[str, str, str], int] = {}  # (key, endpoint, class)
        self.key_rejections: dict[tuple[str, str], int] = {}  # (key, code)
        self.key_tokens: dict[tuple[str, str], int] = {}  # (key, kind)

    @staticmethod
    def _inc(table: dict[Any, int], key: Any, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n

    def observe(self, record: Outcome) -> None:
        key = record.key_name or ANONYMOUS_KEY
        endpoint = record.endpoint
        self._inc(self.requests, (endpoint, str(record.status)))
        self._inc(self.key_requests, (key, endpoint, record.qos or "none"))
        if is_rejection(record):
            self._inc(self.key_rejections, (key, record.error_code or "unknown"))
        for kind in ("prompt", "completion"):
            n = int(record.usage.get(f"{kind}_tokens") or 0)
            if n:
                self._inc(self.key_tokens, (key, kind), n)
        hist = self.durations.get(endpoint)
        if hist is None:
            hist = self.durations[endpoint] = Histogram(DURATION_BUCKETS_S)
        hist.observe(time.time() - record.started_s)

    def families(self) -> Iterator[Metric]:
        counters = (
            ("superfluid_http_generation_requests_total", "Generation requests (chat, completions) by endpoint and HTTP status.", ["endpoint", "status"], self.requests),
            ("superfluid_key_requests_total", 'Generation requests per API key (key="anonymous" without one), endpoint and class.', ["key", "endpoint", "class"], self.key_requests),
            ("superfluid_key_rejections_total", "Generation requests refused before any reply (4xx/5xx other than client disconnects), per key and error code.", ["key", "code"], self.key_rejections),
            ("superfluid_key_tokens_total", "Tokens per API key, by kind (prompt, completion).", ["key", "kind"], self.key_tokens),
        )
        for name, help_, labels, table in counters:
            yield labelled(CounterMetricFamily, name, help_, labels, sorted(table.items()))
        yield histogram(
            "superfluid_http_generation_duration_seconds",
            "Time from request to the end of its response, by endpoint.",
            "endpoint",
            {e: h.stats() for e, h in sorted(self.durations.items())},
        )


web_metrics = WebMetrics()


def observe_record(record: Outcome) -> None:
    web_metrics.observe(record)


# -- several models: the router (scheduler/link/pool.py) --------------------------------------

MODEL_STATES = ("unloaded", "loading", "loaded", "draining")
# families the router gives across every model; they replace the one worker snapshot's (family
# names as prometheus_client keeps them: a counter's without its "_total")
ROUTER_OVERRIDES = frozenset(
    {
        "llamaswap_scheduler_queue_depth",
        "llamaswap_scheduler_queue_oldest_wait_seconds",
        "llamaswap_scheduler_dispatched",
        "llamaswap_scheduler_reorders",
    }
)


# router_stats() field -> (metric name, help, label): a gauge with a sample for each of the
# label's values (LABEL_VALUES), 0 where the field has none
ROUTER_BY_LABEL: dict[str, tuple[str, str, str]] = {
    "queue_depth_by_band": ("llamaswap_scheduler_queue_depth", "Requests waiting (at the model router and at each model's worker), by priority band.", "band"),
    "queue_oldest_wait_s_by_band": ("llamaswap_scheduler_queue_oldest_wait_seconds", "How long the longest-waiting request has waited, by band.", "band"),
}
# router_stats() field -> (metric name, help, label): a counter with a sample for each label value the field holds
ROUTER_COUNTERS: dict[str, tuple[str, str, str]] = {
    "dispatched_by_band": ("llamaswap_scheduler_dispatched_total", "Requests the model router dispatched, by band.", "band"),
    "reorders": ("llamaswap_scheduler_reorders_total", "Dispatches where aging or swap affinity changed the pick.", "reason"),
    "loads": ("superfluid_model_loads_total", "Times each model was loaded (a worker started and said hello).", "model"),
}


def router_families(stats: Mapping[str, Any]) -> Iterator[Metric]:
    """The families of the pool's ``router_stats()``: the seed's llamaswap_scheduler_* across
    every model (the router's queue plus each resident worker's), and model loads and states."""
    yield from gauges_by_label(ROUTER_BY_LABEL, stats)
    for field, (name, help_, label) in ROUTER_COUNTERS.items():
        yield labelled(CounterMetricFamily, name, help_, [label], sorted(([k], n) for k, n in (stats.get(field) or {}).items()))
    yield histogram(
        "superfluid_model_load_seconds",
        "Time from starting a model's worker to its hello (the model loaded).",
        "model",
        stats.get("load_seconds") or {},
    )
    states: Mapping[str, str] = stats.get("states") or {}
    yield labelled(
        GaugeMetricFamily,
        "superfluid_model_state",
        "1 for each model's current state.",
        ["model", "state"],
        [([m, st], 1 if shown == st else 0) for m, shown in states.items() for st in MODEL_STATES],
    )


def models_families(snapshots: Mapping[str, Mapping[str, Any]]) -> Iterator[Metric]:
    """Several models: each loaded model's worker families, every sample labelled with its
    ``model`` (a worker's counters start from zero with each load, so one series per model keeps
    every series monotonic where the model used last made them jump), less the families the
    router gives across every model."""
    merged: dict[str, Metric] = {}
    for model, snapshot in sorted(snapshots.items()):
        for fam in snapshot_families(snapshot):
            if fam.name in ROUTER_OVERRIDES:
                continue
            into = merged.get(fam.name)
            if into is None:
                into = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            into.samples += [s._replace(labels={**s.labels, "model": model}) for s in fam.samples]
    yield from merged.values()


LINK_CONNECTED = ("superfluid_worker_connected", "1 while the engine worker is connected over the link.")
LINK_RESTARTS = ("superfluid_worker_restarts_total", "Times a new engine worker process said hello.")
LINK_INFLIGHT = ("superfluid_requests_inflight", "Generation requests the web side holds open.")


def links_families(links: Mapping[str, Mapping[str, Any]]) -> Iterator[Metric]:
    """Several models: the link families of each loaded model's worker, labelled by model (the
    pool's own link submits nothing: its figures were always 1, 0 and 0)."""
    rows = sorted(links.items())
    yield labelled(GaugeMetricFamily, *LINK_CONNECTED, ["model"], [([m], 1 if ln.get("connected") else 0) for m, ln in rows])
    yield labelled(CounterMetricFamily, *LINK_RESTARTS, ["model"], [([m], int(ln.get("restarts") or 0)) for m, ln in rows])
    yield labelled(GaugeMetricFamily, *LINK_INFLIGHT, ["model"], [([m], int(ln.get("inflight") or 0)) for m, ln in rows])


def pool_state() -> Mapping[str, Any] | None:
    """The router's figures when serve runs several models; None in the single-worker server."""
    from scheduler.link.pool import router_stats

    return router_stats()


# -- the collector --------------------------------------------------------------------------------


def live_snapshot(snapshot: Mapping[str, Any] | None, connected: bool) -> Mapping[str, Any] | None:
    """The snapshot /metrics renders: a worker's latest while its link is connected, none while
    the worker is away (crashed, restarting, loading its model again). The link keeps the lost
    worker's last snapshot, whose busy lanes, queues and KV pool are nobody's any more; its
    families leave, as before the first snapshot, and come back (counters from 0, a reset to
    Prometheus) with the next worker's. A Redis fleet's snapshot (``fleet``) says itself when no
    worker is left and is rendered while Redis answers (:func:`link_state`)."""
    if not snapshot:
        return None
    return snapshot if connected or "fleet" in snapshot else None


def link_state() -> tuple[Mapping[str, Any] | None, bool, int, int] | None:
    """(latest snapshot, connected, worker restarts, requests in flight) of this event loop's
    link client; None off an event loop (no link there)."""
    from superfluid_site.runtime import get_link

    try:
        link = get_link()
    except RuntimeError:
        return None
    # a fleet head that cannot reach Redis knows nothing of the fleet: the workers, busy lanes and
    # global queue it last read are not the present state (they were reported, frozen, for as
    # long as Redis stayed away), as a lost worker's are not
    snapshot = link.snapshot if getattr(link, "redis_ok", True) else None
    return snapshot, bool(link.connected), int(link.worker_restarts), link.requests_in_flight()


class SuperfluidCollector:
    """Everything superfluid adds to the registry, read at each scrape."""

    def __init__(
        self,
        link: Callable[[], tuple[Mapping[str, Any] | None, bool, int, int] | None] = link_state,
        router: Callable[[], Mapping[str, Any] | None] = pool_state,
    ) -> None:
        self.link = link
        self.router = router

    def describe(self) -> list[Metric]:
        return []  # the names depend on nothing registered elsewhere; collect() only at a scrape

    def collect(self) -> Iterator[Metric]:
        state = self.link()
        router = self.router()
        if state is not None:
            snapshot, connected, restarts, inflight = state
            snapshot = live_snapshot(snapshot, connected)
            if router is not None and "snapshots" in router:
                links: Mapping[str, Mapping[str, Any]] = router.get("links") or {}
                snapshots: Mapping[str, Mapping[str, Any]] = router["snapshots"] or {}
                yield from models_families({m: s for m, s in snapshots.items() if live_snapshot(s, (links.get(m) or {}).get("connected", True))})
                yield from links_families(router.get("links") or {})
            else:
                if snapshot:
                    yield from snapshot_families(snapshot)
                yield gauge(LINK_CONNECTED[0], LINK_CONNECTED[1], 1 if connected else 0)
                yield counter(LINK_RESTARTS[0], LINK_RESTARTS[1], restarts)
                yield gauge(LINK_INFLIGHT[0], LINK_INFLIGHT[1], inflight)
        if router is not None:
            yield from router_families(router)
        yield from web_metrics.families()


collector = SuperfluidCollector()
REGISTRY.register(collector)


# -- who sees what -------------------------------------------------------------------------------


class KeyView:
    """A registry as one key sees it: its own series of the per-key families (those labelled
    ``key``), and every other family whole, less (``allows_model``: a policy that lists its
    models) the series labelled by a model it may not use, which is not there for it (404
    ``model_not_found`` on /v1/models, /props and a chat)."""

    def __init__(self, registry: Collector, key_name: str, allows_model: Callable[[str], bool] | None = None) -> None:
        self.registry = registry
        self.key_name = key_name
        self.allows_model = allows_model

    def collect(self) -> Iterator[Metric]:
        allows = self.allows_model
        for fam in self.registry.collect():
            per_key = fam.name.startswith("superfluid_key_") or any("key" in s.labels for s in fam.samples)
            hidden = allows is not None and any("model" in s.labels and not allows(s.labels["model"]) for s in fam.samples)
            if per_key or hidden:
                own = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                own.samples = [
                    s
                    for s in fam.samples
                    if (not per_key or s.labels.get("key") == self.key_name) and (allows is None or "model" not in s.labels or allows(s.labels["model"]))
                ]
                fam = own
            yield fam


def metrics_viewer(request: HttpRequest) -> tuple[str | None, bool]:
    """(key name, is admin) of whoever scrapes, from the principal ``key_required`` put on the
    request. No key (allowed only while keys are not required) sees everything."""
    principal = getattr(request, "principal", None)
    key_name = getattr(principal, "key_name", None)
    if key_name is None:
        return None, True
    return key_name, bool(getattr(principal, "is_admin", False))


def models_viewer(request: HttpRequest) -> Callable[[str], bool] | None:
    """Which models the scraping key may see: None (every one) without a key or with a policy
    that lists none; else those its policy allows, by id or alias (``model_allowed``)."""
    from .admission import model_allowed

    policy = getattr(getattr(request, "principal", None), "policy", None)
    if policy is None or not policy.allowed_models:
        return None
    return lambda model: model_allowed(policy, model)


def exposition(key_name: str | None = None, is_admin: bool = True, registry: Collector = REGISTRY, allows_model: Callable[[str], bool] | None = None) -> str:
    """The text format of ``registry`` as one viewer sees it: ``key_name=None`` (no key: an
    anonymous loopback scrape) or an admin key sees everything; another key, its own per-key
    series, and only the models ``allows_model`` allows (None: every one)."""
    view: Collector = registry if key_name is None or is_admin else KeyView(registry, key_name, allows_model)
    return generate_latest(view).decode("utf-8")


@key_required()
async def metrics(request: HttpRequest) -> HttpResponse:
    """Any valid key may scrape (none needed while keys are optional); a non-admin key sees
    only its own per-key series, and no series of a model its policy does not allow."""
    key_name, is_admin = metrics_viewer(request)
    return HttpResponse(exposition(key_name, is_admin, allows_model=models_viewer(request)), content_type=CONTENT_TYPE)
