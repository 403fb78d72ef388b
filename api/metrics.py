"""GET /metrics: Prometheus text format for the web process and the engine worker, on one port.

Three parts, in this order:

1. django-prometheus's registry (``django_http_*``: the Django views' requests, responses and
   latencies; the process collector);
2. the engine worker's own metrics, shipped inside its latest snapshot (``snapshot["metrics"]``,
   see ``scheduler/worker/metrics.py``) plus what is derived from the snapshot itself (the KV
   pool) and the link (is the worker connected, how often it restarted);
3. the web side's generation counters, filled from each request's :class:`RequestRecord` when its
   response ends: per endpoint and status, and per API key. A non-admin key sees only its own
   per-key series (:func:`visible_families`).

The worker's families use one plain-JSON shape (``{name: {"type", "help", "samples"}}``) that
:func:`render` turns into the text format; the web-side counters use it too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse

from scheduler.worker.metrics import Histogram, all_families, family

from .admission import key_required

if TYPE_CHECKING:
    from .records import RequestRecord

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ANONYMOUS_KEY = "anonymous"  # the key label of requests made without an API key
DURATION_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, float("inf"))


# -- the text format -----------------------------------------------------------------------


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: Any) -> str:
    if isinstance(value, str):  # "+Inf" from a JSON bucket bound
        return value
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    number = float(value)
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    if number.is_integer() and abs(number) < 1e15:
        return str(int(number))
    return repr(number)


def _le(bound: Any) -> str:
    """A bucket bound as prometheus_client writes it ("0.5", "1.0", "+Inf"), so series stay stable."""
    if isinstance(bound, str):
        return bound
    number = float(bound)
    return "+Inf" if math.isinf(number) else repr(number)


def _labels(labels: Mapping[str, Any]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(str(v))}"' for k, v in labels.items()) + "}"


def render(families: Mapping[str, Mapping[str, Any]]) -> str:
    """Families in the worker's JSON shape -> Prometheus text exposition format 0.0.4."""
    lines: list[str] = []
    for name, fam in families.items():
        kind = fam.get("type", "untyped")
        lines.append(f"# HELP {name} {_escape_help(str(fam.get('help', '')))}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in fam.get("samples", []):
            if kind == "histogram":
                for le, count in value.get("buckets", []):
                    lines.append(f"{name}_bucket{_labels({**labels, 'le': _le(le)})} {format_value(count)}")
                lines.append(f"{name}_sum{_labels(labels)} {format_value(value.get('sum', 0))}")
                lines.append(f"{name}_count{_labels(labels)} {format_value(value.get('count', 0))}")
            else:
                lines.append(f"{name}{_labels(labels)} {format_value(value)}")
    return "\n".join(lines) + ("\n" if lines else "")


# -- web-side counters, filled from request records -------------------------------------------


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

    def observe(self, record: RequestRecord) -> None:
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

    def families(self) -> dict[str, Any]:
        return {
            "superfluid_http_generation_requests_total": family(
                "counter",
                "Generation requests (chat, completions) by endpoint and HTTP status.",
                [({"endpoint": e, "status": s}, n) for (e, s), n in sorted(self.requests.items())],
            ),
            "superfluid_http_generation_duration_seconds": family(
                "histogram",
                "Time from request to the end of its response, by endpoint.",
                [({"endpoint": e}, h.export()) for e, h in sorted(self.durations.items())],
            ),
            "superfluid_key_requests_total": family(
                "counter",
                "Generation requests per API key (key=\"anonymous\" without one), endpoint and class.",
                [({"key": k, "endpoint": e, "class": c}, n) for (k, e, c), n in sorted(self.key_requests.items())],
            ),
            "superfluid_key_rejections_total": family(
                "counter",
                "Generation requests refused before any reply (4xx/5xx other than client disconnects), per key and error code.",
                [({"key": k, "code": c}, n) for (k, c), n in sorted(self.key_rejections.items())],
            ),
            "superfluid_key_tokens_total": family(
                "counter",
                "Tokens per API key, by kind (prompt, completion).",
                [({"key": k, "kind": kind}, n) for (k, kind), n in sorted(self.key_tokens.items())],
            ),
        }


def is_rejection(record: RequestRecord) -> bool:
    """Refused rather than served: an error status, not a client that went away."""
    return record.status >= 400 and record.status != 499


web_metrics = WebMetrics()


def observe_record(record: RequestRecord) -> None:
    web_metrics.observe(record)


# -- who sees what -------------------------------------------------------------------------------


def visible_families(families: Mapping[str, Mapping[str, Any]], key_name: str | None, is_admin: bool) -> dict[str, Any]:
    """What one viewer may see. ``key_name=None`` (no key: an anonymous loopback scrape) or an
    admin key sees everything; any other key sees only its own series of the per-key families
    (those labelled ``key``), and every other family whole."""
    if key_name is None or is_admin:
        return dict(families)
    out: dict[str, Any] = {}
    for name, fam in families.items():
        samples = fam.get("samples", [])
        if any("key" in labels for labels, _ in samples) or name.startswith("superfluid_key_"):
            fam = {**fam, "samples": [[labels, v] for labels, v in samples if labels.get("key") == key_name]}
        out[name] = fam
    return out


def metrics_viewer(request: HttpRequest) -> tuple[str | None, bool]:
    """(key name, is admin) of whoever scrapes, from the principal ``key_required`` put on the
    request. No key (allowed only while keys are not required) sees everything."""
    principal = getattr(request, "principal", None)
    key_name = getattr(principal, "key_name", None)
    if key_name is None:
        return None, True
    return key_name, bool(getattr(principal, "is_admin", False))


# -- the view ------------------------------------------------------------------------------------


def worker_families() -> dict[str, Any]:
    """The worker's families from its latest snapshot, plus link state; empty before the first."""
    from scheduler.link.client import get_link

    link = get_link()
    state = link.snapshot or {}
    out: dict[str, Any] = {}
    if state:
        out.update(all_families(state))
    out["superfluid_worker_connected"] = family("gauge", "1 while the engine worker is connected over the link.", [({}, 1 if link.connected else 0)])
    out["superfluid_worker_restarts_total"] = family("counter", "Times a new engine worker process said hello.", [({}, link.worker_restarts)])
    fleet = state.get("fleet") if state else None
    if fleet:  # Redis mode: the fleet, not one worker
        out["superfluid_fleet_workers"] = family("gauge", "Engine workers alive in the Redis fleet.", [({}, len(fleet))])
        out["superfluid_fleet_lanes_busy"] = family(
            "gauge",
            "Busy lanes of each fleet worker.",
            [({"worker": w.get("worker", ""), "host": w.get("host", "")}, sum(1 for lane in w.get("lanes") or [] if lane.get("job_id"))) for w in fleet],
        )
        out["superfluid_fleet_lanes"] = family("gauge", "Lanes of each fleet worker.", [({"worker": w.get("worker", ""), "host": w.get("host", "")}, w.get("n_lanes", 0)) for w in fleet])
        out["superfluid_global_queue_depth"] = family("gauge", "Jobs waiting in the Redis queue, by class.", [({"class": c}, n) for c, n in (state.get("global_queue") or {}).items()])
    out["superfluid_requests_inflight"] = family("gauge", "Generation requests the web side holds open.", [({}, len(link.inflight))])
    return out


def exposition(key_name: str | None = None, is_admin: bool = True) -> str:
    from prometheus_client import REGISTRY, generate_latest

    parts = [generate_latest(REGISTRY).decode("utf-8")]
    parts.append(render(worker_families()))
    parts.append(render(visible_families(web_metrics.families(), key_name, is_admin)))
    return "".join(parts)


@key_required()
async def metrics(request: HttpRequest) -> HttpResponse:
    """Any valid key may scrape (none needed while keys are optional); a non-admin key sees
    only its own per-key series."""
    key_name, is_admin = metrics_viewer(request)
    return HttpResponse(exposition(key_name, is_admin), content_type=CONTENT_TYPE)

