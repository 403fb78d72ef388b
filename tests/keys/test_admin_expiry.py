"""A new key's expiry in the admin: in the future, as ``createkey --expires-days`` (more than 0)."""

from __future__ import annotations

import pytest
from django.test import Client

from keys.models import ApiKey
from keys.runtime import read_version


@pytest.mark.django_db
def test_a_new_key_that_would_be_expired_already_is_refused(admin_client: Client) -> None:
    """The page said "API key created" and showed its secret once; the server refused it from
    its first request (401 "This API key has expired."): a date typo gave a dead key."""
    before = read_version()
    r = admin_client.post(
        "/admin/keys/apikey/add/",
        {"name": "late", "policy": "", "owner": "", "notes": "", "expires_0": "2020-01-01", "expires_1": "00:00:00"},
    )
    assert r.status_code == 200 and not ApiKey.objects.filter(name="late").exists()
    assert "expires" in r.context["adminform"].form.errors
    assert read_version() == before


@pytest.mark.django_db
def test_a_new_key_with_a_future_expiry_is_issued(admin_client: Client) -> None:
    r = admin_client.post(
        "/admin/keys/apikey/add/",
        {"name": "brief", "policy": "", "owner": "", "notes": "", "expires_0": "2999-01-01", "expires_1": "00:00:00"},
    )
    assert r.status_code == 200 and ApiKey.objects.get(name="brief").expires is not None
