"""The key list's status filter agrees with its status column: each key is under one status."""

from __future__ import annotations

import datetime
import re

import pytest
from django.test import Client
from django.utils import timezone

from keys import actions
from keys.models import ApiKey


@pytest.mark.django_db
def test_each_key_is_listed_under_the_one_status_its_column_shows(admin_client: Client) -> None:
    past = timezone.now() - datetime.timedelta(days=1)
    actions.create_key(ApiKey(name="live"))
    actions.create_key(ApiKey(name="stopped"))
    actions.create_key(ApiKey(name="lapsed"))
    actions.create_key(ApiKey(name="stopped-and-lapsed"))
    ApiKey.objects.filter(name__startswith="stopped").update(revoked=True)
    ApiKey.objects.filter(name__endswith="lapsed").update(expires=past)
    shown = {"active": {"live"}, "revoked": {"stopped", "stopped-and-lapsed"}, "expired": {"lapsed"}}
    for status, names in shown.items():
        page = admin_client.get(f"/admin/keys/apikey/?status={status}").content.decode()
        listed = set(re.findall(r'<th class="field-name"><a [^>]*>([^<]+)</a>', page))
        assert listed == names, status
