"""The dashboard header's links open for the staff user looking at it."""

from __future__ import annotations

import dataclasses
import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from superfluid_site.serving import installed, serving


def header_links(body: str) -> list[str]:
    header = body.split("<header>", 1)[1].split("</header>", 1)[0]
    return re.findall(r'href="(/[^"]*)"', header)


def staff(client: Client) -> Client:
    client.force_login(get_user_model().objects.create_user("ops", password="pw", is_staff=True))
    return client


@pytest.mark.django_db(transaction=True)  # the key runtime reads the keys on a thread of its own
def test_where_keys_are_required_every_link_in_the_header_opens_for_the_staff_user(client: Client) -> None:
    """Where keys are required (--require-key, or any --host beyond loopback: every remote
    deployment), /metrics and /slots answer a browser 401 invalid_api_key (it cannot send a
    key), so the header's links to them led the operator to an error; they are left out there."""
    with installed(dataclasses.replace(serving(), keys_required=True)):
        page = staff(client).get("/dashboard/")
        assert page.status_code == 200
        links = header_links(page.content.decode())
        assert "/admin/" in links
        for link in links:
            status = client.get(link).status_code
            assert status not in (401, 403), (link, status)


@pytest.mark.django_db
def test_where_keys_are_optional_the_header_links_metrics_and_slots(client: Client) -> None:
    with installed(dataclasses.replace(serving(), keys_required=False)):
        page = staff(client).get("/dashboard/")
    assert {"/metrics", "/slots", "/admin/"} <= set(header_links(page.content.decode()))
