from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from superfluid_site.view_only_admin import ViewOnlyAdmin

from .models import ActivityEntry


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
        "serial_score",
        "queue_wait_ms",
        "ttft_ms",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "preemptions",
        "finish_reason",
        "status",
        "error_code",
    )
    list_filter = ("endpoint", "qos_class", "band", "status", "finish_reason", "error_code", "stream", "key_name", "model", "time")
    search_fields = ("request_id", "key_name", "model", "error_code")
    date_hierarchy = "time"
    ordering = ("-time",)
    list_per_page = 100
    show_full_result_count = False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in self.model._meta.fields]
