from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from .models import Batch, File


class MadeByTheApi(admin.ModelAdmin):  # type: ignore[type-arg]
    """Rows the Batch and Files APIs make: shown (and deleted) here, never added."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Batch)
class BatchAdmin(MadeByTheApi):
    list_display = ("id", "status", "endpoint", "owner", "total", "completed", "failed", "created_at")
    list_filter = ("status", "endpoint")
    search_fields = ("id", "owner")
    readonly_fields = [f.name for f in Batch._meta.fields]


@admin.register(File)
class FileAdmin(MadeByTheApi):
    list_display = ("id", "purpose", "filename", "bytes", "owner", "created_at")
    list_filter = ("purpose",)
    search_fields = ("id", "filename", "owner")
    exclude = ("content",)
    readonly_fields = ("id", "purpose", "filename", "bytes", "owner", "created_at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[File]:
        return super().get_queryset(request).defer("content")  # up to 8 MiB a file
