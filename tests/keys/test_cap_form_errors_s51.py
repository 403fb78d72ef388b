"""A class-lane cap outside 1..--max-batch is told the range, whatever side it is on: a negative
one was told "Ensure this value is greater than or equal to 0." (the column's own bound), so the
operator who tried 0 next was then told 1..--max-batch. On the add page and in the caps list's
editable column alike; nothing is saved and the running server hears of nothing."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keys import actions
from keys.models import ClassLaneCap
from keys.runtime import read_version
from scheduler.core.qos import QosClass
from tests.keys.test_caps_list_stale_edit import LIST, _list_form, _row

RANGE = "Must be between 1 and the worker&#x27;s --max-batch (4)."
OUTSIDE = st.integers(max_value=0) | st.integers(min_value=5)
TEXT = st.one_of(OUTSIDE.map(str), st.sampled_from(["-0", "+0", "-1", "  -2 ", "-32769", "-99999999999999999999"]))


def _errors(r: object) -> list[str]:
    form = r.context["adminform"].form if "adminform" in r.context else r.context["cl"].formset.forms[0]  # type: ignore[attr-defined]
    return list(form.errors.get("max_lanes", []))


@pytest.mark.django_db
@override_settings(SUPERFLUID_MAX_BATCH=4)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=TEXT)
def test_the_add_page_tells_any_cap_outside_the_range_the_range(admin_client: Client, value: str) -> None:
    before = read_version()
    r = admin_client.post("/admin/keys/classlanecap/add/", {"model": "", "qos_class": str(int(QosClass.BACKGROUND)), "max_lanes": value})
    assert r.status_code == 200
    assert [e.replace("'", "&#x27;") for e in _errors(r)] == [RANGE]
    assert not ClassLaneCap.objects.exists() and read_version() == before


@pytest.mark.django_db
@override_settings(SUPERFLUID_MAX_BATCH=4)
@pytest.mark.parametrize("value", ["-3", "0", "5", "-99999999999999999999"])
def test_the_caps_list_tells_a_cap_outside_the_range_the_range(admin_client: Client, value: str) -> None:
    cap = actions.set_cap(int(QosClass.BACKGROUND), 2)
    form = _list_form(admin_client)
    before = read_version()
    r = admin_client.post(LIST, {**form, f"{_row(form, cap)}-max_lanes": value, "_save": "Save"})
    assert r.status_code == 200 and RANGE in r.content.decode()
    assert "greater than or equal to" not in r.content.decode()
    assert ClassLaneCap.objects.get(pk=cap.pk).max_lanes == 2 and read_version() == before


@pytest.mark.django_db
@override_settings(SUPERFLUID_MAX_BATCH=4)
def test_a_cap_in_the_range_is_saved(admin_client: Client) -> None:
    r = admin_client.post("/admin/keys/classlanecap/add/", {"model": "", "qos_class": str(int(QosClass.BACKGROUND)), "max_lanes": "1"})
    assert r.status_code == 302 and ClassLaneCap.objects.get().max_lanes == 1
