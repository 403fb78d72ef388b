"""An admin for rows the server writes: they can be browsed, never added, changed or deleted there."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest


class ViewOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
