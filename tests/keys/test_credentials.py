"""Secrets: generated once, stored as a SHA-256 digest plus a display prefix, found by digest."""

from __future__ import annotations

import hashlib

import pytest

from keys import actions
from keys.credentials import digest_of, display_prefix, new_secret, secret_from_headers
from keys.models import ApiKey
from keys.runtime import Key, Snapshot, load_snapshot


def test_a_new_secret_is_long_random_and_prefixed() -> None:
    a, b = new_secret(), new_secret()
    assert a.startswith("sf-") and len(a) >= 40 and a != b
    assert display_prefix(a) == a[:8]


def test_the_digest_is_sha256_hex_of_the_secret() -> None:
    secret = new_secret()
    assert digest_of(secret) == hashlib.sha256(secret.encode()).hexdigest()
    assert len(digest_of(secret)) == 64


def test_lookup_finds_a_key_by_the_digest_of_what_the_client_sent() -> None:
    secret = new_secret()
    key = Key(id=1, name="alice", digest=digest_of(secret))
    snapshot = Snapshot(version=1, keys_by_digest={key.digest: key})
    assert snapshot.lookup(secret) is key
    assert snapshot.lookup(secret + "x") is None
    assert snapshot.lookup(key.digest) is None  # the digest itself is not a credential
    assert snapshot.lookup("") is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"authorization": "Bearer sf-abc"}, "sf-abc"),
        ({"authorization": "bearer   sf-abc  "}, "sf-abc"),
        ({"x-api-key": "sf-xyz"}, "sf-xyz"),
        ({"authorization": "Bearer sf-abc", "x-api-key": "sf-xyz"}, "sf-abc"),
        ({"authorization": "Basic dXNlcjpwdw=="}, None),
        ({"authorization": "Bearer "}, None),
        ({"x-api-key": "  "}, None),
        ({}, None),
    ],
)
def test_the_key_comes_from_a_bearer_token_or_x_api_key(headers: dict[str, str], expected: str | None) -> None:
    assert secret_from_headers(headers) == expected


@pytest.mark.django_db
def test_a_created_key_is_stored_only_as_digest_and_prefix_and_loads_by_digest() -> None:
    secret = actions.create_key(ApiKey(name="alice"))
    row = ApiKey.objects.get(name="alice")
    assert row.digest == digest_of(secret) and row.prefix == secret[:8]
    stored = [str(v) for v in ApiKey.objects.values_list().get(pk=row.pk)]
    assert secret not in stored
    snapshot = load_snapshot()
    found = snapshot.lookup(secret)
    assert found is not None and found.name == "alice" and found.policy is None
    assert snapshot.version >= 1
