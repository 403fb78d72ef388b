"""The admin's "Served models" page: each model the running server serves, with load and unload.

Resident or not (state), lanes in use, what waits for it at the router by band, last use, TTL,
requests sent to it and loads; and the router's whole queue by band. The rows come from the
running server (dashboard/served.py), never from the database. With several models each row has
a Load or Unload button: a POST (CSRF-protected, as every admin form) to
``<model>/load/`` or ``<model>/unload/``, for superusers and staff given *Can load and unload
served models*; it asks the router in this web process (``served.model_action``) and is
recorded in the admin's log (the model's history, *Recent actions*).
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from scheduler.core.router import BANDS
from superfluid_site.view_only_admin import ViewOnlyAdmin

from .models import ServedModel
from .served import ACTIONS, ActionRefused, model_action, served_state

MANAGE_PERMISSION = "dashboard.manage_servedmodel"


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "never"
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@admin.register(ServedModel)
class ServedModelAdmin(ViewOnlyAdmin):
    def can_manage(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_staff and request.user.has_perm(MANAGE_PERMISSION))

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> ServedModel:
        # no table: an object is its id, so the admin's history of a model (its log entries) opens
        return ServedModel(id=object_id)

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.action_view)  # login, staff, CSRF, never cached
        actions = [path(f"<path:model_id>/{a}/", view, {"action": a}, name=f"dashboard_servedmodel_{a}") for a in ACTIONS]
        return [*actions, *super().get_urls()]

    def action_view(self, request: HttpRequest, model_id: str, action: str) -> HttpResponse:
        """POST: load or unload ``model_id`` through the router, log it, back to the list."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.can_manage(request):
            raise PermissionDenied
        try:
            model = model_action(model_id, action)
        except ActionRefused as exc:
            messages.error(request, str(exc))
        else:
            when = "as soon as a model slot is free or an idle model can go" if action == "load" else "once its admitted work has finished"
            self.log_change(request, ServedModel(id=model), f"Asked the router to {action} the model.")
            messages.success(request, f"The router will {action} {model} {when}.")
        return HttpResponseRedirect(reverse("admin:dashboard_servedmodel_changelist"))

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
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
                    # a failed load's backoff: requests for it are refused this many seconds more
                    "backoff_text": f"Requests are refused for {math.ceil(m['load_backoff_s'])} s more; Load tries it now." if m.get("load_backoff_s") else "",
                }
            )
        context = {
            **self.admin_site.each_context(request),
            "title": "Served models",
            "opts": self.model._meta,
            "state": state,
            "rows": rows,
            "queue": [(b, state["queue"][b]["depth"], state["queue"][b]["oldest_wait_s"]) for b in BANDS],
            "can_manage": state["router"] and self.can_manage(request),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "dashboard/admin_models.html", context)
