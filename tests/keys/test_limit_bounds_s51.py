"""A policy's requests per minute and max concurrent are bounded, in the admin and in the
--key-policy file alike, by PostgreSQL's integer (keys.models.MAX_LIMIT).

Before: the admin on SQLite saved up to 2**63 - 1 (a database moved to PostgreSQL later refused
the row), and the file took any JSON integer: one beyond a float's range made admission's
``rpm / 60`` raise OverflowError, a 500 for every request of the policy's keys."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from hypothesis import given, settings
from hypothesis import strategies as st

from keys.models import MAX_LIMIT, KeyPolicy
from keys.policyfile import PolicyFileError, parse_policy_file
from keys.runtime import read_version
from tests.keys.test_admin import POLICY_FORM


@pytest.mark.django_db
@pytest.mark.parametrize("field", ["rate_limit_rpm", "max_concurrent"])
@pytest.mark.parametrize("value", [MAX_LIMIT + 1, 2**32, 2**63 - 1])
def test_the_admin_refuses_a_limit_beyond_postgresqls_integer_on_every_database(admin_client: Client, field: str, value: int) -> None:
    before = read_version()
    r = admin_client.post("/admin/keys/keypolicy/add/", {**POLICY_FORM, field: str(value)})
    assert r.status_code == 200
    # here the policy's own check; on PostgreSQL Django's column check answers first
    assert list(r.context["adminform"].form.errors) == [field]
    assert not KeyPolicy.objects.exists() and read_version() == before


@pytest.mark.django_db
def test_the_admin_takes_a_limit_at_the_bound(admin_client: Client) -> None:
    r = admin_client.post("/admin/keys/keypolicy/add/", {**POLICY_FORM, "rate_limit_rpm": str(MAX_LIMIT), "max_concurrent": str(MAX_LIMIT)})
    assert r.status_code == 302, r.content.decode()[:2000]
    assert KeyPolicy.objects.get(name="team").rate_limit_rpm == MAX_LIMIT


def _file(**policy: object) -> str:
    return json.dumps({"policies": [{"name": "p", **policy}], "keys": [{"name": "k", "sha256": "a" * 64, "policy": "p"}]})


@settings(max_examples=50, deadline=None)
@given(field=st.sampled_from(["rate_limit_rpm", "max_concurrent"]), value=st.integers(min_value=MAX_LIMIT + 1) | st.integers(max_value=-1) | st.just(10**400))
def test_the_file_refuses_a_limit_outside_what_the_admin_takes(field: str, value: int) -> None:
    with pytest.raises(PolicyFileError, match=rf"policies\[0\]: rate_limit_rpm and max_concurrent must be between 0 and {MAX_LIMIT}"):
        parse_policy_file(_file(**{field: value}))


@settings(max_examples=50, deadline=None)
@given(rpm=st.integers(min_value=0, max_value=MAX_LIMIT), concurrent=st.integers(min_value=0, max_value=MAX_LIMIT))
def test_every_limit_the_file_takes_gives_admission_a_finite_refill_rate(rpm: int, concurrent: int) -> None:
    key = next(iter(parse_policy_file(_file(rate_limit_rpm=rpm, max_concurrent=concurrent)).values()))
    assert key.policy is not None and key.policy.rate_limit_rpm == rpm and key.policy.max_concurrent == concurrent
    assert rpm / 60.0 < float("inf")  # what api/admission.py computes from it
