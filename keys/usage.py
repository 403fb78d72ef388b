"""Per-key usage for the admin, read from the activity log (one row per generation request).

A request counts for the key whose name it carried (``ActivityEntry.key_name``): rotating a
key's secret keeps its history, renaming a key starts a new one. Tokens in are the prompt's
tokens, tokens out the completion's; an error is a request answered with a 4xx/5xx status or
one that ended with an error code (a stream that failed after its 200). Nothing is counted for
longer than the activity log keeps rows (SUPERFLUID_ACTIVITY_RETENTION_DAYS, 30 by default).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, IntegerField, OuterRef, Q, Subquery, Sum, Value
from django.db.models.functions import Coalesce, TruncDay, TruncHour
from django.utils import timezone

from activity.models import ActivityEntry

WINDOWS = {"24h": datetime.timedelta(hours=24), "30d": datetime.timedelta(days=30)}
ERROR = Q(status__gte=400) | ~Q(error_code="")
MEASURES = {
    "requests": Count("pk"),
    "tokens_in": Sum("prompt_tokens"),
    "tokens_out": Sum("completion_tokens"),
    "errors": Count("pk", filter=ERROR),
}


def annotations(now: datetime.datetime | None = None) -> dict[str, Any]:
    """For an ApiKey queryset: ``usage_<measure>_<window>`` (e.g. ``usage_requests_24h``) for
    every measure and window, each a subquery on the activity log's (key_name, time) index."""
    now = now or timezone.now()
    out: dict[str, Any] = {}
    for window, span in WINDOWS.items():
        rows = ActivityEntry.objects.filter(key_name=OuterRef("name"), time__gt=now - span).order_by().values("key_name")
        for measure, aggregate in MEASURES.items():
            sub = Subquery(rows.annotate(v=aggregate).values("v")[:1], output_field=IntegerField())
            out[f"usage_{measure}_{window}"] = Coalesce(sub, Value(0))
    return out


@dataclass(frozen=True)
class Bucket:
    start: datetime.datetime
    requests: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    errors: int = 0


def buckets(key_name: str, hours: bool, now: datetime.datetime | None = None) -> list[Bucket]:
    """The last 24 hours by hour (``hours``), or the last 30 days by day (UTC), oldest first,
    one bucket for every hour or day, empty ones included: the same rows as :func:`totals`'
    window, so the first bucket (the hour or day the window starts in) counts only those after
    its start, and the bars add up to the totals beside them."""
    now = now or timezone.now()
    if hours:
        span, step, trunc = WINDOWS["24h"], datetime.timedelta(hours=1), TruncHour("time")
        last = now.replace(minute=0, second=0, microsecond=0)
    else:
        span, step, trunc = WINDOWS["30d"], datetime.timedelta(days=1), TruncDay("time")
        last = now.replace(hour=0, minute=0, second=0, microsecond=0)
    n = span // step + 1  # the window's first, partial, bucket and the current one
    first = last - step * (n - 1)
    rows = (
        ActivityEntry.objects.filter(key_name=key_name, time__gt=now - span)
        .order_by()
        .annotate(start=trunc)
        .values("start")
        .annotate(**MEASURES)
    )
    found = {r["start"]: r for r in rows}
    out = []
    for i in range(n):
        start = first + step * i
        r = found.get(start, {})
        out.append(Bucket(start, r.get("requests") or 0, r.get("tokens_in") or 0, r.get("tokens_out") or 0, r.get("errors") or 0))
    return out


def totals(key_name: str, now: datetime.datetime | None = None) -> dict[str, dict[str, int]]:
    """{window: {measure: n}} for one key."""
    now = now or timezone.now()
    out = {}
    for window, span in WINDOWS.items():
        agg = ActivityEntry.objects.filter(key_name=key_name, time__gt=now - span).aggregate(**MEASURES)
        out[window] = {m: int(agg[m] or 0) for m in MEASURES}
    return out


def chart(series: list[Bucket], label: str, width: int = 600, height: int = 120) -> dict[str, Any]:
    """An inline SVG bar chart's geometry: requests per bucket, the errors among them in a
    second colour; the template draws it (no script, nothing fetched)."""
    peak = max((b.requests for b in series), default=0) or 1
    slot = width / max(len(series), 1)
    bars = []
    for i, b in enumerate(series):
        h = round(b.requests / peak * (height - 4), 1)
        eh = round(b.errors / peak * (height - 4), 1)
        when = b.start.strftime("%Y-%m-%d %H:00 UTC" if label == "hour" else "%Y-%m-%d")
        bars.append(
            {
                "x": round(i * slot + 1, 1),
                "w": round(max(slot - 2, 1), 1),
                "y": round(height - h, 1),
                "h": h,
                "ey": round(height - eh, 1),
                "eh": eh,
                "title": f"{when}: {b.requests} requests, {b.tokens_in} tokens in, {b.tokens_out} out, {b.errors} errors",
            }
        )
    return {"bars": bars, "width": width, "height": height, "peak": peak if any(b.requests for b in series) else 0}
