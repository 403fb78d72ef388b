"""Two admins save one change page (or the caps list), both opened on the same version of the row.
The stale check (``StaleEditForm.clean``, ``CapsListForm.clean``) read the row and the write
came later: both saves passed it, and the second silently overwrote the first (a key revoked by
one admin was restored by the other's edit of its notes), and both were pushed to the running
server. On PostgreSQL (READ COMMITTED) a change page's check and write leave that window; on
SQLite the caps list's does (its rows are checked before its transaction begins). Each race is
driven here in the order that loses: B's check, then A's whole save, then B's write. The write
is now conditional on the version the page showed (``claim``): B is refused, the transaction
rolls back, and only A's save reaches the running server."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection, connections, transaction
from django.test import Client, RequestFactory

from keys import actions
from keys.admin import CapsListForm, StaleEditForm, StaleRowError
from keys.models import ApiKey, ClassLaneCap, KeyPolicy
from keys.runtime import read_version
from scheduler.core.qos import QosClass
from tests.keys.test_admin import POLICY_FORM
from tests.keys.test_caps_list_stale_edit import LIST, _list_form, _row

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit runs: the pushes are counted


@pytest.fixture
def pushes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each push of a committed change to the running server (``keys.actions._notify``)."""
    import superfluid_site.runtime

    seen: list[int] = []
    monkeypatch.setattr(superfluid_site.runtime, "poke_keys", lambda: seen.append(read_version()))
    return seen


def _seen(admin_client: Client, url: str) -> str:
    match = re.search(r'name="seen_updated" value="([^"]*)"', admin_client.get(url).content.decode())
    assert match, "the change form carries the row's last change"
    return match.group(1)


def _checked(model: type[Any], pk: int, data: dict[str, str], user: User) -> tuple[Any, Any, Any]:
    """B's POST up to its check: the admin's object, its form (validated) and the request."""
    model_admin = admin.site._registry[model]
    request = RequestFactory().post("/", data)
    request.user = user
    obj = model_admin.get_object(request, str(pk))
    form = model_admin.get_form(request, obj, change=True)(data, instance=obj)
    assert form.is_valid(), form.errors  # the check passes: the row is still as B's page showed it
    return model_admin, request, form


def _written(model_admin: Any, request: Any, form: Any) -> None:
    """B's POST from its check on: the write, in one transaction, as the admin does it."""
    with transaction.atomic():
        obj = model_admin.save_form(request, form, change=True)
        model_admin.save_model(request, obj, form, change=True)


def test_a_policy_saved_twice_on_one_version_keeps_the_first_save(admin_client: Client, admin_user: User, pushes: list[int]) -> None:
    policy = actions.save_policy(KeyPolicy(name="team"))
    url = f"/admin/keys/keypolicy/{policy.pk}/change/"
    seen = _seen(admin_client, url)  # A and B open the page on one version
    b = _checked(KeyPolicy, policy.pk, {**POLICY_FORM, "rate_limit_rpm": "60", "seen_updated": seen}, admin_user)
    before, pushes[:] = read_version(), []
    r = admin_client.post(url, {**POLICY_FORM, "max_concurrent": "1", "seen_updated": seen})  # A's save, whole
    assert r.status_code == 302
    with pytest.raises(StaleRowError):
        _written(*b)
    policy.refresh_from_db()
    assert (policy.max_concurrent, policy.rate_limit_rpm) == (1, 0)  # A's save stands, B's did not go through
    assert read_version() == before + 1 and pushes == [before + 1]  # A's alone reached the server


def test_a_key_revoked_by_one_admin_is_not_restored_by_anothers_save_on_the_same_version(
    admin_client: Client, admin_user: User, pushes: list[int]
) -> None:
    actions.create_key(ApiKey(name="bob"))
    bob = ApiKey.objects.get(name="bob")
    url = f"/admin/keys/apikey/{bob.pk}/change/"
    seen = _seen(admin_client, url)
    form = {"name": "bob", "policy": "", "owner": "", "notes": "", "expires_0": "", "expires_1": "", "seen_updated": seen}
    b = _checked(ApiKey, bob.pk, {**form, "notes": "owner moved to team B"}, admin_user)  # B edits the notes
    before, pushes[:] = read_version(), []
    assert admin_client.post(url, {**form, "revoked": "on"}).status_code == 302  # A revokes the key
    with pytest.raises(StaleRowError):
        _written(*b)
    bob.refresh_from_db()
    assert bob.revoked and bob.notes == ""
    assert pushes == [before + 1]


def test_a_cap_saved_from_two_lists_opened_on_one_version_keeps_the_first_save(
    admin_client: Client, admin_user: User, monkeypatch: pytest.MonkeyPatch, pushes: list[int]
) -> None:
    """Through the list's own POST: A's whole save lands after B's rows were checked."""
    agent = actions.set_cap(int(QosClass.AGENT), 3)
    form = _list_form(admin_client)  # A and B open the list
    a = Client()
    a.force_login(admin_user)
    check = CapsListForm.clean
    a_saved: list[int] = []

    def then_a_saves(self: CapsListForm) -> dict[str, Any]:
        cleaned = check(self)
        if not a_saved:  # B's row checked; now A's save, whole, before B's write
            a_saved.append(0)
            a_saved[0] = a.post(LIST, {**form, f"{_row(form, agent)}-max_lanes": "1", "_save": "Save"}).status_code
        return cleaned

    monkeypatch.setattr(CapsListForm, "clean", then_a_saves)
    before, pushes[:] = read_version(), []
    r = admin_client.post(LIST, {**form, f"{_row(form, agent)}-max_lanes": "2", "_save": "Save"}, follow=True)
    assert a_saved == [302]
    assert ClassLaneCap.objects.get(pk=agent.pk).max_lanes == 1  # A's cap stands
    assert "changed since this page was opened" in r.content.decode()  # B is told
    assert read_version() == before + 1 and pushes == [before + 1]


def test_a_save_that_lost_the_race_shows_the_page_again_with_the_refusal(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch, pushes: list[int]
) -> None:
    policy = actions.save_policy(KeyPolicy(name="team"))
    url = f"/admin/keys/keypolicy/{policy.pk}/change/"
    seen = _seen(admin_client, url)
    monkeypatch.setattr(StaleEditForm, "claim", lambda self: False)  # another save got there first
    before, pushes[:] = read_version(), []
    r = admin_client.post(url, {**POLICY_FORM, "max_concurrent": "1", "seen_updated": seen})
    assert r.status_code == 302 and r["Location"] == url
    assert "changed since this page was opened" in admin_client.get(url).content.decode()
    policy.refresh_from_db()
    assert policy.max_concurrent == 0 and read_version() == before and pushes == []


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite's BEGIN IMMEDIATE runs one change page's POST at a time")
def test_two_threads_saving_one_policy_page_at_once_on_postgresql(admin_user: User, monkeypatch: pytest.MonkeyPatch, pushes: list[int]) -> None:
    """The race itself, on PostgreSQL: two POSTs of one page, both past the check before either
    writes (a barrier right after ``clean``). One goes through; the other is refused."""
    policy = actions.save_policy(KeyPolicy(name="team"))
    url = f"/admin/keys/keypolicy/{policy.pk}/change/"
    clients = [Client(), Client()]
    for c in clients:
        c.force_login(admin_user)
    seen = _seen(clients[0], url)
    barrier, check = threading.Barrier(2, timeout=30), StaleEditForm.clean

    def checked_then_wait(self: StaleEditForm) -> dict[str, Any]:
        cleaned = check(self)
        barrier.wait()
        return cleaned

    monkeypatch.setattr(StaleEditForm, "clean", checked_then_wait)
    before, pushes[:] = read_version(), []
    answers: dict[str, str] = {}

    def save(c: Client, field: str) -> None:
        try:
            answers[field] = c.post(url, {**POLICY_FORM, field: "7", "seen_updated": seen})["Location"]
        finally:
            connections.close_all()

    threads = [threading.Thread(target=save, args=(c, f)) for c, f in zip(clients, ("max_concurrent", "rate_limit_rpm"), strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    policy.refresh_from_db()
    assert sorted(answers.values()) == sorted(["/admin/keys/keypolicy/", url])  # one saved, one refused
    won = "max_concurrent" if answers["max_concurrent"] != url else "rate_limit_rpm"
    assert (policy.max_concurrent, policy.rate_limit_rpm) == ((7, 0) if won == "max_concurrent" else (0, 7))
    assert read_version() == before + 1 and pushes == [before + 1]
