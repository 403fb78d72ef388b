"""A rotate or a restore in the admin that leaves the key refused says so on the page that
answers it, instead of presenting a secret or a key that the server still answers 401."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.utils import timezone

from keys import actions
from keys.models import ApiKey

SECRET = re.compile(r"sf-[A-Za-z0-9_-]{43}")


def rotate(client: Client, key: ApiKey) -> str:
    page = client.post(f"/admin/keys/apikey/{key.pk}/rotate/")
    assert page.status_code == 200
    body = page.content.decode()
    assert len(set(SECRET.findall(body))) == 1  # the new secret, shown as always
    return body


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["revoked", "expired"])
def test_rotating_a_refused_key_says_the_new_secret_is_refused_too(admin_client: Client, how: str) -> None:
    """A leaked key is revoked at once, then rotated to give its holder a new secret: the page
    said "has a new secret, below. The old one is refused from now on." and nothing else, and the
    new secret, handed out, got 401 invalid_api_key (the key stays revoked, or expired)."""
    actions.create_key(ApiKey(name="k"))
    key = ApiKey.objects.get(name="k")
    if how == "revoked":
        actions.revoke_keys([key])
    else:
        ApiKey.objects.filter(pk=key.pk).update(expires=timezone.now() - timedelta(minutes=1))
    asked = admin_client.get(f"/admin/keys/apikey/{key.pk}/rotate/").content.decode()
    assert f"This key is {how}" in asked and "refused too" in asked  # said before, too
    body = rotate(admin_client, ApiKey.objects.get(pk=key.pk))
    assert f"This key is {how}" in body and "refused too" in body


@pytest.mark.django_db
def test_rotating_an_active_key_gives_no_such_warning(admin_client: Client) -> None:
    actions.create_key(ApiKey(name="k"))
    body = rotate(admin_client, ApiKey.objects.get(name="k"))
    assert "refused too" not in body


@pytest.mark.django_db
def test_restoring_an_expired_key_says_it_is_still_refused(admin_client: Client) -> None:
    """*Restore* undoes a revoke; on a key that has also expired the list said "Restored 1
    key(s)." and the key stayed refused (its status column: expired)."""
    actions.create_key(ApiKey(name="old", revoked=True, expires=timezone.now() + timedelta(days=1)))
    actions.create_key(ApiKey(name="fine", revoked=True))
    ApiKey.objects.filter(name="old").update(expires=timezone.now() - timedelta(minutes=1))
    ids = [str(pk) for pk in ApiKey.objects.values_list("pk", flat=True)]
    r = admin_client.post("/admin/keys/apikey/", {"action": "restore_selected", "_selected_action": ids, "index": "0"})
    assert r.status_code == 302
    shown = [str(m) for m in get_messages(r.wsgi_request)]
    assert any("Restored 2 key(s)" in m for m in shown)
    assert any("old" in m and "expired" in m and "still refused" in m for m in shown), shown
    assert not any("fine" in m and "still refused" in m for m in shown)
