"""The class-lane caps list edits ``max_lanes`` in place, and its Save posts every row's value
as the page showed it. Django saved each row whose posted value differed from the database's: a
cap another admin (or ``set_cap``) changed while the list was open was put back to the old value
by a save that only meant to change another row, silently, and the worker got the old cap back.
Now a row left alone is not saved, and a row edited here after it changed elsewhere is refused,
as a change page refuses it (docs/keys.md, "Edits that meet")."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from django.test import Client

from keys import actions
from keys.models import ClassLaneCap
from keys.runtime import read_version
from scheduler.core.qos import QosClass

LIST = "/admin/keys/classlanecap/"


class _Inputs(HTMLParser):
    """The changelist form's inputs, as a browser posts them (name -> value)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        name = a.get("name")
        if tag == "input" and name and name.startswith(("form-", "initial-form-")) and a.get("type") != "checkbox":
            self.values[name] = a.get("value") or ""


def _list_form(admin_client: Client) -> dict[str, str]:
    page = admin_client.get(LIST)
    assert page.status_code == 200
    parser = _Inputs()
    parser.feed(page.content.decode())
    return parser.values


def _row(form: dict[str, str], cap: ClassLaneCap) -> str:
    """The form prefix (``form-N``) of ``cap``'s row."""
    return next(name[: -len("-id")] for name, value in form.items() if name.endswith("-id") and value == str(cap.pk))


@pytest.mark.django_db
def test_saving_the_caps_list_does_not_put_back_a_cap_changed_since_the_list_was_opened(admin_client: Client) -> None:
    background = actions.set_cap(int(QosClass.BACKGROUND), 2)
    agent = actions.set_cap(int(QosClass.AGENT), 3)
    form = _list_form(admin_client)  # admin A opens the list
    actions.set_cap(int(QosClass.AGENT), 1)  # meanwhile admin B lowers agent's cap to 1
    # A changes background's cap only; agent's row still shows 3
    r = admin_client.post(LIST, {**form, f"{_row(form, background)}-max_lanes": "1", "_save": "Save"})
    assert r.status_code == 302
    assert ClassLaneCap.objects.get(pk=agent.pk).max_lanes == 1  # B's change stands
    assert ClassLaneCap.objects.get(pk=background.pk).max_lanes == 1  # A's goes through


@pytest.mark.django_db
def test_a_cap_edited_in_the_list_after_it_changed_elsewhere_is_refused(admin_client: Client) -> None:
    agent = actions.set_cap(int(QosClass.AGENT), 3)
    form = _list_form(admin_client)  # admin A opens the list
    actions.set_cap(int(QosClass.AGENT), 1)  # meanwhile admin B lowers it to 1
    before = read_version()
    r = admin_client.post(LIST, {**form, f"{_row(form, agent)}-max_lanes": "2", "_save": "Save"})
    assert r.status_code == 200 and "changed since this page was opened" in r.content.decode()
    assert ClassLaneCap.objects.get(pk=agent.pk).max_lanes == 1 and read_version() == before
    fresh = _list_form(admin_client)  # reloaded: the edit goes through
    r = admin_client.post(LIST, {**fresh, f"{_row(fresh, agent)}-max_lanes": "2", "_save": "Save"})
    assert r.status_code == 302 and ClassLaneCap.objects.get(pk=agent.pk).max_lanes == 2


@pytest.mark.django_db
def test_saving_the_caps_list_unchanged_rows_stay_as_they_are(admin_client: Client) -> None:
    """Rows nobody touched are not saved (no version bump for them), stamp or not."""
    background = actions.set_cap(int(QosClass.BACKGROUND), 2)
    actions.set_cap(int(QosClass.AGENT), 3)
    form = _list_form(admin_client)
    before = read_version()
    r = admin_client.post(LIST, {**form, "_save": "Save"})
    assert r.status_code == 302 and read_version() == before
    r = admin_client.post(LIST, {**form, f"{_row(form, background)}-max_lanes": "4", "_save": "Save"})
    assert r.status_code == 302 and read_version() == before + 1
    assert ClassLaneCap.objects.get(pk=background.pk).max_lanes == 4
