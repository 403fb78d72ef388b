"""The admin's "Served models" page: each model the running server serves, read-only.

Resident or not (state), lanes in use, what waits for it at the router by band, last use, TTL,
requests sent to it and loads; and the router's whole queue by band. The rows come from the
running server (dashboard/served.py), never from the database; load and unload stay with
``POST /v1/internal/models/<id>/load|unload``.
"""

from __future__ import annotations

import datetime
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from scheduler.core.router import BANDS

from .models import ServedModel
from .served import served_state


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "never"
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        state = served_state()
        rows = []
        for m in state["models"]:
            band = m.get("waiting_by_band") or {}
            rows.append(
                {
                    **m,
                    "queue": [(b, band.get(b, 0)) for b in BANDS],
                    "last_used_text": _when(m.get("last_used")),
                    "ttl_text": "never" if not m.get("ttl_s") else f"{m['ttl_s']:g} s",
                }
            )
        context = {
            **self.admin_site.each_context(request),
            "title": "Served models",
            "opts": self.model._meta,
            "state": state,
            "rows": rows,
            "queue": [(b, state["queue"][b]["depth"], state["queue"][b]["oldest_wait_s"]) for b in BANDS],
            **(extra_context or {}),
        }
        return TemplateResponse(request, "dashboard/admin_models.html", context)
