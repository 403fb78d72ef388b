"""The live lane dashboard: a staff-only page; its data arrives over the websocket."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from .feed import MIN_INTERVAL_S


@staff_member_required(login_url="admin:login")
def dashboard(request: HttpRequest) -> HttpResponse:
    """Anonymous and non-staff users are sent to the admin login with ?next=/dashboard/. The
    header links /metrics and /slots only where keys are optional: where they are required, those
    routes answer a browser (which sends no key, only the staff session) 401."""
    from api.admission import keys_required

    context = {"push_interval_ms": int(MIN_INTERVAL_S * 1000), "api_links": not keys_required()}
    return render(request, "dashboard/index.html", context)
