from django.contrib import admin

from .models import Batch, File


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    list_display = ("id", "status", "endpoint", "owner", "total", "completed", "failed", "created_at")
    list_filter = ("status", "endpoint")
    search_fields = ("id", "owner")
    readonly_fields = [f.name for f in Batch._meta.fields]


@admin.register(File)
class FileAdmin(admin.ModelAdmin):
    list_display = ("id", "purpose", "filename", "bytes", "owner", "created_at")
    list_filter = ("purpose",)
    search_fields = ("id", "filename", "owner")
    exclude = ("content",)
    readonly_fields = ("id", "purpose", "filename", "bytes", "owner", "created_at")
