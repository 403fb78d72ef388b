"""Keys, key policies and class-lane caps in the admin. Saves go through ``keys.actions`` so the
running server hears about them within a second."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied, ValidationError
from django.db.models import Count, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone

from superfluid_site.serving import serving

from . import actions, usage
from .models import ApiKey, ClassLaneCap, KeyPolicy, lanes_range_message, static_key_policy
from .snapshot import STATIC_KEY_NAME

_SECRET_ATTR = "_superfluid_new_secret"  # the new secret rides on the request object, nowhere else


class ErrorsOnTheForm(forms.ModelForm):  # type: ignore[type-arg]
    """A model's ``clean()`` may name a field this form does not show (one read-only here, or
    left out of the list's editable columns): Django then raised ValueError ("has no field
    named"), a 500. Such an error is shown above the form's fields instead."""

    def add_error(self, field: str | None, error: Any) -> None:
        if field is None and isinstance(error, ValidationError) and hasattr(error, "error_dict"):
            kept: dict[str, list[Any]] = {}
            for name, errors in error.error_dict.items():
                target = name if name == NON_FIELD_ERRORS or name in self.fields else NON_FIELD_ERRORS
                kept.setdefault(target, []).extend(errors)
            error = ValidationError(kept)
        super().add_error(field, error)


STALE_ROW = (
    "This row was changed since this page was opened (by another admin, a command or "
    "the bulk action). Reload the page to see the change, then make your edit again."
)


class StaleEditForm(ErrorsOnTheForm):
    """A change form carries when its row was last changed (``updated``). Saving it after
    someone else changed the row is refused: it would post every field as the page showed it
    and silently undo their change (restore a key revoked meanwhile, say)."""

    seen_updated = forms.CharField(widget=forms.HiddenInput, required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None and self.instance.updated is not None:
            self.fields["seen_updated"].initial = self.instance.updated.isoformat()

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        seen, row = cleaned.get("seen_updated"), self.instance
        if seen and row.pk is not None and row.updated is not None and seen != row.updated.isoformat():
            raise forms.ValidationError(STALE_ROW)
        return cleaned

    def claim(self) -> bool:
        """In the save's transaction, just before the write: whether the row is still the one
        the page showed, moving it on in the same conditional UPDATE. ``clean()`` alone let two
        saves opened on one version both pass (it reads, the write comes later), and the second
        silently overwrote the first; of two such saves the second now finds no row here."""
        seen, row = self.cleaned_data.get("seen_updated"), self.instance
        if not seen or row.pk is None:
            return True
        at = datetime.datetime.fromisoformat(seen)
        return type(row)._default_manager.filter(pk=row.pk, updated=at).update(updated=timezone.now()) == 1


class StaleRowError(Exception):
    """A save that lost to another one made since its page was checked (``claim``)."""


class CapsListForm(ErrorsOnTheForm):
    """A row of the caps list, whose Save posts every row's ``max_lanes`` as the page showed it.
    Compared with the database only, a cap changed elsewhere since the page was opened counted
    as edited here and was put back to the old value by a save meant for another row. Each row
    carries the value it showed (``show_hidden_initial``): a row left alone is not saved, and
    one edited here after it changed elsewhere is refused, as on a change page."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "max_lanes" in self.fields:
            self.fields["max_lanes"].show_hidden_initial = True

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        if "max_lanes" not in self.fields or self.instance.pk is None:
            return cleaned
        field = self.fields["max_lanes"]
        try:  # absent (a page without it): nothing to compare with
            shown = field.to_python(self.data.get(self["max_lanes"].html_initial_name))
        except ValidationError:
            shown = None
        if shown is not None and "max_lanes" in self.changed_data and shown != self.initial.get("max_lanes"):
            raise forms.ValidationError(STALE_ROW)
        return cleaned

    def claim(self) -> bool:
        """As ``StaleEditForm.claim``: the list is checked outside the save's transaction, so a
        cap saved elsewhere in between was put back; the row must still hold the value shown."""
        try:
            shown = self.fields["max_lanes"].to_python(self.data.get(self["max_lanes"].html_initial_name))
        except (KeyError, ValidationError):
            return True
        if shown is None or self.instance.pk is None:
            return True
        return ClassLaneCap.objects.filter(pk=self.instance.pk, max_lanes=shown).update(updated=timezone.now()) == 1


def _claim(form: Any, change: bool) -> None:
    """Refuse the save (the whole transaction rolls back, and nothing is pushed to the running
    server) when another one got to the row since the form was checked."""
    if change and hasattr(form, "claim") and not form.claim():
        raise StaleRowError(STALE_ROW)


class ThroughActions(admin.ModelAdmin):
    """Saves and deletes go through ``keys.actions`` (which bump the config version), never a
    bare ``.save()``: ``save_row`` and ``delete_rows`` name the two actions. Change forms refuse
    a save over a change made since they were opened (``StaleEditForm``)."""

    form = StaleEditForm
    save_row: Callable[[Any], Any]
    delete_rows: Callable[[list[Any]], int]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        _claim(form, change)
        self.save_row(obj)

    def changeform_view(self, request: HttpRequest, object_id: str | None = None, form_url: str = "", extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return self._page_again_if_stale(request, super().changeform_view, object_id, form_url, extra_context)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return self._page_again_if_stale(request, super().changelist_view, extra_context)

    def _page_again_if_stale(self, request: HttpRequest, view: Callable[..., HttpResponse], *args: Any) -> HttpResponse:
        """``view(request, *args)``; when its save lost to another one (``StaleRowError``: the
        whole save rolled back, every row of a list's save with it), the page again as the rows
        are now, with the refusal."""
        try:
            return view(request, *args)
        except StaleRowError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        self.delete_rows([obj])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self.delete_rows(list(queryset))


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
        if self.value() == "expired":  # a revoked key is listed as revoked, as its status column says
            return queryset.filter(revoked=False, expires__lte=now)
        return queryset


def _usage_column(measure: str) -> Callable[[Any, ApiKey], str]:
    """A changelist column: ``measure`` over the last 24 hours / 30 days, sorted by the 30 days."""

    @admin.display(description=f"{measure.replace('_', ' ')} 24 h / 30 d", ordering=f"usage_{measure}_30d")
    def column(admin_: Any, obj: ApiKey) -> str:
        day, month = getattr(obj, f"usage_{measure}_24h", None), getattr(obj, f"usage_{measure}_30d", None)
        if day is None or month is None:
            return "-"
        return f"{day:,} / {month:,}"

    return column


@admin.register(ApiKey)
class ApiKeyAdmin(ThroughActions):
    delete_rows = staticmethod(actions.delete_keys)  # before ``actions`` below names the admin actions
    list_display = (
        "name", "secret_prefix", "policy", "owner", "status", "created", "last_used", "expires",
        "requests", "tokens_in", "tokens_out", "errors",
    )
    list_filter = (KeyStatusFilter, "revoked", "policy")
    search_fields = ("name", "owner", "notes", "prefix")
    list_select_related = ("policy",)
    readonly_fields = ("secret_prefix", "created", "last_used")
    date_hierarchy = "created"
    actions = ("revoke_selected", "restore_selected")

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        if obj is None:  # add: the secret is made on save and shown once
            return ["name", "policy", "owner", "notes", "expires"]
        return ["name", "secret_prefix", "policy", "owner", "notes", "expires", "revoked", "created", "last_used", "seen_updated"]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> tuple[str, ...]:
        # files, batches, limits and the activity log go by the name: it stays what it was created with
        return (*self.readonly_fields, "name") if obj is not None else tuple(self.readonly_fields)

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

    # -- usage, from the activity log (keys/usage.py) ----------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApiKey]:
        qs = super().get_queryset(request)
        match = getattr(request, "resolver_match", None)
        # the list shown, not its bulk actions (a POST): they would sum every selected key's usage
        if match is not None and match.url_name == "keys_apikey_changelist" and request.method != "POST":
            qs = qs.annotate(**usage.annotations())
        return qs

    requests = _usage_column("requests")
    tokens_in = _usage_column("tokens_in")
    tokens_out = _usage_column("tokens_out")
    errors = _usage_column("errors")

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None) -> HttpResponse:
        obj = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if obj is not None:
            now = timezone.now()
            context["usage_totals"] = usage.totals(obj.name, now)
            context["usage_hours"] = usage.chart(usage.buckets(obj.name, hours=True, now=now), "hour")
            context["usage_days"] = usage.chart(usage.buckets(obj.name, hours=False, now=now), "day")
            if self.has_change_permission(request, obj):  # a view-only admin may not rotate it
                context["rotate_url"] = reverse("admin:keys_apikey_rotate", args=[obj.pk])
        return super().change_view(request, object_id, form_url, context)

    # -- rotating a secret ----------------------------------------------------------------

    def get_urls(self) -> list[Any]:
        rotate = path("<int:key_id>/rotate/", self.admin_site.admin_view(self.rotate_view), name="keys_apikey_rotate")
        return [rotate, *super().get_urls()]

    def rotate_view(self, request: HttpRequest, key_id: int) -> HttpResponse:
        """GET: ask. POST: a new secret, shown on this one page only (never stored, not even in
        a message or the session); the old one is refused from the server's next read on."""
        key = ApiKey.objects.filter(pk=key_id).first()
        if key is None:
            raise Http404("No such API key.")
        if not self.has_change_permission(request, key):
            raise PermissionDenied
        opts = self.model._meta
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "opts": opts,
            "original": key,
            "change_url": reverse("admin:keys_apikey_change", args=[key.pk]),
            "add_url": reverse("admin:keys_apikey_add"),
            "list_url": reverse("admin:keys_apikey_changelist"),
            # a revoked or expired key refuses its new secret too: said before and after, so the
            # secret is not handed out as one that works
            "refused": "revoked" if key.revoked else "expired" if key.is_expired() else None,
        }
        if request.method != "POST":
            context["title"] = f"Rotate the secret of “{key.name}”"
            return TemplateResponse(request, "admin/keys/apikey/rotate.html", context)
        old_prefix = key.prefix
        secret = actions.rotate_key(key)
        self.log_change(request, key, f"Rotated the secret ({old_prefix}… replaced by {key.prefix}…).")
        context.update(title=f"API key “{key.name}”: new secret", secret=secret, rotated=True)
        response = TemplateResponse(request, "admin/keys/apikey/created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    # -- saving ---------------------------------------------------------------------------

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        _claim(form, change)
        if change:
            actions.save_key(obj)
        else:
            setattr(request, _SECRET_ATTR, actions.create_key(obj))

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

    def _set_revoked(self, request: HttpRequest, queryset: QuerySet[ApiKey], revoked: bool) -> int:
        """Revoke (or restore) in one transaction, and note it in each key's history (the admin's
        LogEntry) with who did it. Keys already in that state are left alone."""
        keys = list(queryset.filter(revoked=not revoked))
        if keys:
            actions.revoke_keys(keys, revoked=revoked)
        note = "Revoked with the bulk action." if revoked else "Restored (revoke undone) with the bulk action."
        for key in keys:
            self.log_change(request, key, note)
        return len(keys)

    @admin.action(description="Revoke the selected keys", permissions=["change"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        n = self._set_revoked(request, queryset, True)
        self.message_user(request, f"Revoked {n} key(s); the server refuses them from now on.", messages.SUCCESS)

    @admin.action(description="Restore the selected keys (undo revoke)", permissions=["change"])
    def restore_selected(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        expired = [k.name for k in queryset.filter(revoked=True) if k.is_expired()]
        n = self._set_revoked(request, queryset, False)
        self.message_user(request, f"Restored {n} key(s).", messages.SUCCESS)
        if expired:  # no longer revoked, but refused all the same
            self.message_user(
                request,
                f"These keys have expired and are still refused: {', '.join(expired)}. Give each a later expiry on its page.",
                messages.WARNING,
            )


@admin.register(KeyPolicy)
class KeyPolicyAdmin(ThroughActions):
    save_row = staticmethod(actions.save_policy)
    delete_rows = staticmethod(actions.delete_policies)
    list_display = (
        "name",
        "default_class",
        "max_class",
        "rpm_limit",
        "concurrency_limit",
        "priority_offset",
        "allow_batch_invariant",
        "is_admin",
        "key_count",
    )
    list_filter = ("default_class", "max_class", "allow_batch_invariant", "is_admin")
    search_fields = ("name", "allowed_models")
    readonly_fields = ("created", "updated")
    fieldsets = (
        (None, {"fields": ("name", "seen_updated")}),
        ("Class", {"fields": ("default_class", "max_class", "allow_batch_invariant", "priority_offset")}),
        ("Limits", {"fields": ("rate_limit_rpm", "max_concurrent", "allowed_models")}),
        ("Prefix cache", {"fields": ("share_prefix_cache", "allow_pin_prefix")}),
        ("Access", {"fields": ("is_admin",)}),
        ("History", {"fields": ("created", "updated")}),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[KeyPolicy]:
        return super().get_queryset(request).annotate(n_keys=Count("keys"))

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[Any, Any, Any, Any]:
        """The static key follows its policy by name, not as a row Django's collector finds: the
        delete page (and the bulk delete) lists it as protecting that policy, as an admin key
        protects its own, instead of deleting the policy and leaving the key refused."""
        to_delete, model_count, perms_needed, protected = super().get_deleted_objects(objs, request)
        followed = static_key_policy()
        if followed is not None and any(getattr(obj, "name", None) == followed for obj in objs):
            protected = [*protected, f"the static key {STATIC_KEY_NAME} (SUPERFLUID_API_KEY_POLICY={followed})"]
        return to_delete, model_count, perms_needed, protected

    # 0 is no limit: a column of "0" read as a policy whose keys may make no request at all
    @admin.display(description="requests per minute", ordering="rate_limit_rpm")
    def rpm_limit(self, obj: KeyPolicy) -> str:
        return f"{obj.rate_limit_rpm:,}" if obj.rate_limit_rpm else "unlimited"

    @admin.display(description="max concurrent", ordering="max_concurrent")
    def concurrency_limit(self, obj: KeyPolicy) -> str:
        return f"{obj.max_concurrent:,}" if obj.max_concurrent else "unlimited"

    @admin.display(description="keys", ordering="n_keys")
    def key_count(self, obj: KeyPolicy) -> int:
        n: int = getattr(obj, "n_keys", 0)
        return n + 1 if obj.name == static_key_policy() else n  # the static key follows it too


@admin.register(ClassLaneCap)
class ClassLaneCapAdmin(ThroughActions):
    save_row = staticmethod(actions.save_cap)
    delete_rows = staticmethod(actions.delete_caps)
    list_display = ("__str__", "model_display", "qos_class", "max_lanes", "updated")
    list_editable = ("max_lanes",)
    list_filter = ("qos_class", "model")
    search_fields = ("model",)

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "max_lanes":
            # a negative cap was told "greater than or equal to 0" and a huge one "less than or
            # equal to 9223372036854775807" (the column's own bounds), and 0 then "between 1 and
            # --max-batch": every value outside the range is told the range
            message = lanes_range_message()
            kwargs.update(min_value=1, max_value=int(serving().max_batch), error_messages={"min_value": message, "max_value": message})
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        # a cap whose model is no longer served, edited in the list: the error names ``model``;
        # a row changed elsewhere since the list was opened is not put back (CapsListForm)
        kwargs.setdefault("form", CapsListForm)
        return super().get_changelist_form(request, **kwargs)

    @admin.display(description="model", ordering="model")
    def model_display(self, obj: ClassLaneCap) -> str:
        return obj.model or "all models"
