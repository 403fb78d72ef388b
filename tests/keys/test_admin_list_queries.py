"""The admin's key lists: a fixed number of queries however many rows they show, and bulk
actions that read no more than they change."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from keys import actions
from keys.models import ApiKey, KeyPolicy


def _count(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        r = client.get(url)
    assert r.status_code == 200, r.status_code
    return len(ctx.captured_queries)


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/admin/keys/apikey/", "/admin/keys/keypolicy/"])
def test_list_queries_do_not_grow_with_rows(admin_client: Client, url: str) -> None:
    def add(n0: int, n1: int) -> None:
        for i in range(n0, n1):
            p = actions.save_policy(KeyPolicy(name=f"p{i}"))
            actions.create_key(ApiKey(name=f"k{i}", policy=p))
    add(0, 2)
    few = _count(admin_client, url)
    add(2, 20)
    many = _count(admin_client, url)
    assert many == few


def _reads_activity(client: Client, data: dict[str, object]) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        r = client.post("/admin/keys/apikey/", data)
    assert r.status_code in (200, 302), r.status_code
    return [q["sql"] for q in ctx.captured_queries if "activity_activityentry" in q["sql"]]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "data",
    [
        {"action": "revoke_selected"},
        {"action": "restore_selected"},
        {"action": "delete_selected"},  # the confirmation page
        {"action": "delete_selected", "post": "yes"},
    ],
)
def test_a_bulk_action_does_not_sum_the_usage_of_every_selected_key(admin_client: Client, data: dict[str, object]) -> None:
    """The key list's usage columns are eight aggregates over the activity log per key. The
    bulk actions ran on that same annotated list: revoking (or deleting) every key summed a
    month of the activity log eight times over (0.7 s per 300,000 activity rows here, twice
    for a delete) for columns nobody sees."""
    for i in range(3):
        actions.create_key(ApiKey(name=f"k{i}"))
    assert _reads_activity(admin_client, {**data, "select_across": "1", "index": "0", "_selected_action": ["1"]}) == []
    # the list itself still shows them
    actions.create_key(ApiKey(name="shown"))
    page = admin_client.get("/admin/keys/apikey/?o=9")
    assert page.status_code == 200 and "requests 24 h / 30 d" in page.content.decode().lower()
