"""The key policies list as an operator reads it: 0 is no limit."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from keys import actions
from keys.models import KeyPolicy


def cells(body: str, policy: str) -> list[str]:
    """The text of each cell on ``policy``'s row of the list."""
    row = next(r for r in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S) if f">{policy}</a>" in r)
    return [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)]


@pytest.mark.django_db
def test_the_policy_list_shows_no_limit_as_unlimited_not_zero(admin_client: Client) -> None:
    """A policy without limits (0, the default: every policy made by createkey without --rpm)
    was listed as "requests per minute 0, max concurrent 0": read as keys that may make no
    request at all."""
    actions.save_policy(KeyPolicy(name="open"))
    actions.save_policy(KeyPolicy(name="ci", rate_limit_rpm=1200, max_concurrent=2))
    page = admin_client.get("/admin/keys/keypolicy/")
    assert page.status_code == 200
    body = page.content.decode()
    assert cells(body, "open")[2:6] == ["agent", "agent", "unlimited", "unlimited"]
    assert cells(body, "ci")[2:6] == ["agent", "agent", "1,200", "2"]
    # still sorted by the number
    ordered = admin_client.get("/admin/keys/keypolicy/?o=4").content.decode()
    assert ordered.index(">open</a>") < ordered.index(">ci</a>")
