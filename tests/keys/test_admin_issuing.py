"""The admin for the people who issue keys: rotating a secret, bulk revoke in the history, and
per-key usage from the activity log (columns on the list, a chart on the key's page)."""

from __future__ import annotations

import datetime
import re

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.test import Client
from django.utils import timezone

from activity.models import ActivityEntry
from keys import actions
from keys.credentials import digest_of
from keys.models import ApiKey
from keys.runtime import load_snapshot, read_version

SECRET = re.compile(r"sf-[A-Za-z0-9_-]{43}")


def key(name: str) -> tuple[ApiKey, str]:
    k = ApiKey(name=name)
    secret = actions.create_key(k)
    return k, secret


@pytest.mark.django_db
def test_rotating_shows_a_new_secret_once_and_the_old_one_stops_working(admin_client: Client) -> None:
    k, old = key("alice")
    page = admin_client.get(f"/admin/keys/apikey/{k.pk}/change/").content.decode()
    assert f"/admin/keys/apikey/{k.pk}/rotate/" in page
    # GET only asks; nothing changes
    r = admin_client.get(f"/admin/keys/apikey/{k.pk}/rotate/")
    assert r.status_code == 200 and "Rotate the secret" in r.content.decode()
    assert ApiKey.objects.get(pk=k.pk).digest == digest_of(old)
    before = read_version()
    r = admin_client.post(f"/admin/keys/apikey/{k.pk}/rotate/")
    assert r.status_code == 200 and "no-store" in r["Cache-Control"]
    found = set(SECRET.findall(r.content.decode()))
    assert len(found) == 1 and old not in found
    new = found.pop()
    row = ApiKey.objects.get(pk=k.pk)
    assert row.digest == digest_of(new) and row.prefix == new[:8] and row.name == "alice"
    assert read_version() == before + 1  # the running server's cue to reload
    snap = load_snapshot()
    assert snap.lookup(old) is None and snap.lookup(new) is not None and snap.lookup(new).name == "alice"  # type: ignore[union-attr]
    # shown once: not on the key's page or list afterwards, not in the session or cookies
    for url in (f"/admin/keys/apikey/{k.pk}/change/", "/admin/keys/apikey/"):
        assert new not in admin_client.get(url).content.decode()
    assert new not in str(dict(admin_client.session))
    assert all(new not in str(c.value) for c in admin_client.cookies.values())
    # in the key's history, with who did it, and without the secret
    entry = LogEntry.objects.get(object_id=str(k.pk), action_flag=CHANGE)
    assert entry.user.username == "admin" and "Rotated the secret" in entry.get_change_message()
    assert new not in entry.get_change_message() and row.prefix in entry.get_change_message()
    history = admin_client.get(f"/admin/keys/apikey/{k.pk}/history/").content.decode()
    assert "Rotated the secret" in history


@pytest.mark.django_db
def test_rotation_needs_a_post_with_the_csrf_token_and_change_permission(admin_user: object) -> None:
    k, old = key("bob")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(admin_user)  # type: ignore[arg-type]
    assert strict.post(f"/admin/keys/apikey/{k.pk}/rotate/").status_code == 403
    assert Client().post(f"/admin/keys/apikey/{k.pk}/rotate/").status_code == 302  # to the login page
    assert ApiKey.objects.get(pk=k.pk).digest == digest_of(old)
    client = Client()
    client.force_login(admin_user)  # type: ignore[arg-type]
    assert client.post("/admin/keys/apikey/99999/rotate/").status_code == 404


@pytest.mark.django_db
def test_bulk_revoke_and_restore_are_in_each_keys_history(admin_client: Client) -> None:
    a, _ = key("a")
    b, _ = key("b")
    c, _ = key("c")
    r = admin_client.post("/admin/keys/apikey/", {"action": "revoke_selected", "_selected_action": [str(a.pk), str(b.pk)], "index": "0"})
    assert r.status_code == 302
    assert [k.name for k in ApiKey.objects.filter(revoked=True)] == ["a", "b"]
    entries = LogEntry.objects.filter(action_flag=CHANGE).order_by("object_id")
    assert [(e.object_id, e.user.username) for e in entries] == [(str(a.pk), "admin"), (str(b.pk), "admin")]
    assert all("Revoked" in e.get_change_message() for e in entries)
    # revoking again changes nothing and records nothing
    admin_client.post("/admin/keys/apikey/", {"action": "revoke_selected", "_selected_action": [str(a.pk)], "index": "0"})
    assert LogEntry.objects.filter(action_flag=CHANGE).count() == 2
    admin_client.post("/admin/keys/apikey/", {"action": "restore_selected", "_selected_action": [str(a.pk), str(c.pk)], "index": "0"})
    assert not ApiKey.objects.get(pk=a.pk).revoked
    restored = LogEntry.objects.filter(action_flag=CHANGE, object_id=str(a.pk)).order_by("-action_time").first()
    assert restored is not None and "Restored" in restored.get_change_message()
    assert not LogEntry.objects.filter(object_id=str(c.pk)).exists()  # c was never revoked
    assert "Revoked with the bulk action" in admin_client.get(f"/admin/keys/apikey/{b.pk}/history/").content.decode()


def activity(name: str, ago: datetime.timedelta, *, prompt: int = 10, completion: int = 5, status: int = 200, error_code: str = "") -> ActivityEntry:
    return ActivityEntry(
        time=timezone.now() - ago, key_name=name, endpoint="chat", prompt_tokens=prompt, completion_tokens=completion,
        status=status, error_code=error_code,
    )


@pytest.mark.django_db
def test_the_key_list_shows_usage_for_the_last_day_and_month(admin_client: Client) -> None:
    key("busy")
    key("idle")
    h, d = datetime.timedelta(hours=1), datetime.timedelta(days=1)
    ActivityEntry.objects.bulk_create(
        [
            activity("busy", h),
            activity("busy", 2 * h, prompt=100, completion=0, status=429, error_code="rate_limited"),
            activity("busy", 3 * h, prompt=7, completion=3, status=200, error_code="engine_error"),  # a stream that failed
            activity("busy", 3 * d, prompt=1000, completion=2000),
            activity("busy", 40 * d, prompt=99999, completion=99999),  # beyond 30 days
            activity("someone-else", h, prompt=5000, completion=5000),
        ]
    )
    page = admin_client.get("/admin/keys/apikey/").content.decode()
    rows = {m.group(1): m.group(0) for m in re.finditer(r'<tr[^>]*>.*?>(busy|idle)</a>.*?</tr>', page, re.S)}
    busy, idle = rows["busy"], rows["idle"]

    def cell(row: str, column: str) -> str:
        m = re.search(rf'class="field-{column}[^"]*">([^<]*)<', row)
        assert m is not None, (column, row)
        return m.group(1)

    assert cell(busy, "requests") == "3 / 4"
    assert cell(busy, "tokens_in") == "117 / 1,117"
    assert cell(busy, "tokens_out") == "8 / 2,008"
    assert cell(busy, "errors") == "2 / 2"
    assert [cell(idle, c) for c in ("requests", "tokens_in", "tokens_out", "errors")] == ["0 / 0"] * 4
    # sortable by the month's numbers (the name order puts busy first; these do not)
    for column in (9, 10, 11, 12):  # requests, tokens in, tokens out, errors (0 is the checkbox)
        ordered = admin_client.get(f"/admin/keys/apikey/?o={column}").content.decode()
        assert ordered.index(">idle</a>") < ordered.index(">busy</a>"), column
        ordered = admin_client.get(f"/admin/keys/apikey/?o=-{column}").content.decode()
        assert ordered.index(">busy</a>") < ordered.index(">idle</a>"), column


@pytest.mark.django_db
def test_the_keys_page_has_a_usage_chart_without_scripts(admin_client: Client) -> None:
    k, _ = key("charted")
    ActivityEntry.objects.bulk_create(
        [activity("charted", datetime.timedelta(minutes=5)) for _ in range(4)]
        + [activity("charted", datetime.timedelta(minutes=5), status=500, error_code="server_error")]
        + [activity("charted", datetime.timedelta(days=2)) for _ in range(2)]
    )
    page = admin_client.get(f"/admin/keys/apikey/{k.pk}/change/").content.decode()
    usage = page[page.index('id="key-usage"') :]
    usage = usage[: usage.index("</fieldset>")]
    assert "<script" not in usage and "http" not in usage.replace("help", "")
    assert usage.count("<svg") == 2
    # the 24 h table row: 5 requests, 50 in, 25 out, 1 error; the month adds the two older ones
    assert re.search(r"last 24 hours</th><td>5</td><td>50</td><td>25</td><td>1</td>", usage)
    assert re.search(r"last 30 days</th><td>7</td><td>70</td><td>35</td><td>1</td>", usage)
    assert usage.index("Requests per hour") < usage.index("Requests per day")
    # one <g> per bar: its title, the request bar's height, and the error part's if any
    bars = re.findall(r'<g><title>([^<]*)</title><rect [^>]*height="([^"]*)"[^>]*></rect>(?:<rect [^>]*height="([^"]*)" fill="#ba2121")?', usage)
    assert len(bars) == 25 + 31  # the window's first, partial, hour or day and the current one
    # the hourly chart: one bar (this hour, or the last one just after the hour turned) with all
    # five requests, the error part a fifth of its height
    tall = [(t, float(h), float(e or 0)) for t, h, e in bars[:25] if float(h) > 0]
    assert len(tall) == 1 and tall[0][0].endswith(":00 UTC: 5 requests, 50 tokens in, 25 out, 1 errors")
    assert tall[0][2] == pytest.approx(tall[0][1] / 5, abs=0.1)
    daily = bars[25:]
    assert sum(1 for _, h, _e in daily if float(h) > 0) == 2  # today (or yesterday, just after midnight) and two days ago
