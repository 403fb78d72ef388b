from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from scheduler.core.qos import QosClass
from scheduler.core.router import BANDS
from superfluid_site.view_only_admin import ViewOnlyAdmin

from .models import ActivityEntry

# Django's filter for a plain column lists its values with SELECT DISTINCT over the whole table,
# once per filter and page: seconds per page on a month of rows. These list fixed values, or
# the values of the last RECENT (a range the time index serves), and the one selected.
RECENT = datetime.timedelta(days=1)
NONE = "-"  # the filter value of an empty column (no key, no error code)


def column_filter(field: str, title: str, values: Iterable[str] | None = None) -> type[admin.SimpleListFilter]:
    """A filter on ``field`` listing ``values``, or (None) the values of the last RECENT, the
    selected one and ``(none)`` for an empty column."""
    fixed = None if values is None else [(v, v) for v in values]

    class Column(admin.SimpleListFilter):
        parameter_name = field

        def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
            if fixed is not None:
                return fixed
            rows = ActivityEntry.objects.filter(time__gte=timezone.now() - RECENT).exclude(**{field: ""})
            seen = set(rows.order_by().values_list(field, flat=True).distinct())  # order_by(): not DISTINCT (value, time)
            if self.value() and self.value() != NONE:
                seen.add(str(self.value()))
            return [(NONE, "(none)"), *((v, v) for v in sorted(seen))]

        def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
            value = self.value()
            return queryset if value is None else queryset.filter(**{field: "" if value == NONE else value})

    Column.title = title if fixed is not None else f"{title} (seen in the last day)"
    return Column


class StatusFilter(admin.SimpleListFilter):
    title = "HTTP status"
    parameter_name = "status_class"
    RANGES = {"2xx": Q(status__gte=200, status__lt=300), "429": Q(status=429), "499 (client left)": Q(status=499),
              "other 4xx": Q(status__gte=400, status__lt=500) & ~Q(status__in=(429, 499)), "5xx": Q(status__gte=500)}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(k, k) for k in self.RANGES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(self.RANGES[value]) if value in self.RANGES else queryset


@admin.register(ActivityEntry)
class ActivityEntryAdmin(ViewOnlyAdmin):
    """Browse only: rows are written by the server and removed by the retention prune."""

    list_display = (
        "time",
        "key_name",
        "model",
        "endpoint",
        "qos_class",
        "priority",
        "band",
        "serial_priority",  # the dispatch decision (request-priority seed): why a request waited
        "serial_band",
        "serial_score",
        "serial_queue_wait_ms",  # the router's wait: alone on the row of one that left before its worker took it
        "queue_wait_ms",
        "held_wait_ms",  # of it, with a lane free its class could not take (a class-lane cap): why it waited
        "ttft_ms",
        "total_ms",  # the one time of a request without its worker's answer (left while queued, a deadline, a refusal)
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "preemptions",
        "finish_reason",
        "status",
        "error_code",
    )
    list_filter = (
        column_filter("endpoint", "endpoint", ("chat", "completions", "infill", "embeddings")),
        column_filter("qos_class", "class", (c.label for c in QosClass)),
        column_filter("band", "band", BANDS),
        column_filter("serial_band", "serial band", BANDS),
        StatusFilter,
        column_filter("finish_reason", "finish reason"),
        column_filter("error_code", "error code"),
        "stream",
        column_filter("key_name", "key"),
        column_filter("model", "model"),
        "time",
    )
    # the client address too: a keyless caller asking why their request waited knows their
    # address, not a request id (PostgreSQL's inet is searched as text, HOST(), by Django)
    search_fields = ("request_id", "key_name", "model", "error_code", "client_ip")
    # no date_hierarchy: it lists the years with a DISTINCT over every row's time; the "time"
    # filter (today, past 7 days, this month, this year) reads ranges of the time index
    ordering = ("-time",)
    list_per_page = 100
    show_full_result_count = False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in self.model._meta.fields]
