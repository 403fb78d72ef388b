"""Keys, key policies and class-lane caps in the admin. Saves go through ``keys.actions`` so the
running server hears about them within a second."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from . import actions
from .models import ApiKey, ClassLaneCap, KeyPolicy

_SECRET_ATTR = "_superfluid_new_secret"  # the new secret rides on the request object, nowhere else


class KeyStatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("active", "active"), ("revoked", "revoked"), ("expired", "expired")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> QuerySet[ApiKey]:
        now = timezone.now()
        if self.value() == "active":
            return queryset.filter(revoked=False).filter(Q(expires__isnull=True) | Q(expires__gt=now))
        if self.value() == "revoked":
            return queryset.filter(revoked=True)
        if self.value() == "expired":
            return queryset.filter(expires__lte=now)
        return queryset


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "secret_prefix", "policy", "owner", "status", "created", "last_used", "expires")
    list_filter = (KeyStatusFilter, "revoked", "policy")
    search_fields = ("name", "owner", "notes", "prefix")
    list_select_related = ("policy",)
    readonly_fields = ("secret_prefix", "created", "last_used")
    date_hierarchy = "created"
    actions = ("revoke_selected", "restore_selected")

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        if obj is None:  # add: the secret is made on save and shown once
            return ["name", "policy", "owner", "notes", "expires"]
        return ["name", "secret_prefix", "policy", "owner", "notes", "expires", "revoked", "created", "last_used"]

    @admin.display(description="secret", ordering="prefix")
    def secret_prefix(self, obj: ApiKey) -> str:
        return f"{obj.prefix}…" if obj.prefix else "-"

    @admin.display(description="status")
    def status(self, obj: ApiKey) -> str:
        if obj.revoked:
            return "revoked"
        if obj.is_expired():
            return "expired"
        return "active"

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            actions.save_key(obj)
        else:
            setattr(request, _SECRET_ATTR, actions.create_key(obj))

    def delete_model(self, request: HttpRequest, obj: ApiKey) -> None:
        actions.delete_keys([obj])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        actions.delete_keys(list(queryset))

    def response_add(self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None) -> HttpResponse:
        """Show the new secret on this one page instead of redirecting: it is never stored, not
        even in a message cookie or the session."""
        secret = getattr(request, _SECRET_ATTR, None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        opts = self.model._meta
        context = {
            **self.admin_site.each_context(request),
            "title": f"API key “{obj.name}” created",
            "opts": opts,
            "original": obj,
            "secret": secret,
            "change_url": reverse("admin:keys_apikey_change", args=[obj.pk]),
            "add_url": reverse("admin:keys_apikey_add"),
            "list_url": reverse("admin:keys_apikey_changelist"),
        }
        response = TemplateResponse(request, "admin/keys/apikey/created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke the selected keys")
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        n = actions.revoke_keys(list(queryset))
        self.message_user(request, f"Revoked {n} key(s); the server refuses them from now on.", messages.SUCCESS)

    @admin.action(description="Restore the selected keys (undo revoke)")
    def restore_selected(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        n = actions.revoke_keys(list(queryset), revoked=False)
        self.message_user(request, f"Restored {n} key(s).", messages.SUCCESS)


@admin.register(KeyPolicy)
class KeyPolicyAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "default_class",
        "max_class",
        "rate_limit_rpm",
        "max_concurrent",
        "priority_offset",
        "allow_batch_invariant",
        "is_admin",
        "key_count",
    )
    list_filter = ("default_class", "max_class", "allow_batch_invariant", "is_admin")
    search_fields = ("name", "allowed_models")
    readonly_fields = ("created", "updated")
    fieldsets = (
        (None, {"fields": ("name",)}),
        ("Class", {"fields": ("default_class", "max_class", "allow_batch_invariant", "priority_offset")}),
        ("Limits", {"fields": ("rate_limit_rpm", "max_concurrent", "allowed_models")}),
        ("Prefix cache", {"fields": ("share_prefix_cache", "allow_pin_prefix")}),
        ("Access", {"fields": ("is_admin",)}),
        ("History", {"fields": ("created", "updated")}),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[KeyPolicy]:
        return super().get_queryset(request).annotate(n_keys=Count("keys"))

    @admin.display(description="keys", ordering="n_keys")
    def key_count(self, obj: KeyPolicy) -> int:
        return getattr(obj, "n_keys", 0)

    def save_model(self, request: HttpRequest, obj: KeyPolicy, form: Any, change: bool) -> None:
        actions.save_policy(obj)

    def delete_model(self, request: HttpRequest, obj: KeyPolicy) -> None:
        actions.delete_policies([obj])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[KeyPolicy]) -> None:
        actions.delete_policies(list(queryset))


@admin.register(ClassLaneCap)
class ClassLaneCapAdmin(admin.ModelAdmin):
    list_display = ("__str__", "model_display", "qos_class", "max_lanes", "updated")
    list_editable = ("max_lanes",)
    list_filter = ("qos_class", "model")
    search_fields = ("model",)

    @admin.display(description="model", ordering="model")
    def model_display(self, obj: ClassLaneCap) -> str:
        return obj.model or "all models"

    def save_model(self, request: HttpRequest, obj: ClassLaneCap, form: Any, change: bool) -> None:
        actions.save_cap(obj)

    def delete_model(self, request: HttpRequest, obj: ClassLaneCap) -> None:
        actions.delete_caps([obj])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ClassLaneCap]) -> None:
        actions.delete_caps(list(queryset))
