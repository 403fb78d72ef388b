"""SUPERFLUID_API_KEY: a static key from the environment beside the admin's keys."""

from __future__ import annotations

import asyncio
import logging

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from api.admission import authenticate
from api.errors import ApiError
from keys import actions
from keys.credentials import digest_of
from keys.models import ApiKey, KeyPolicy
from keys.runtime import STATIC_KEY_NAME, KeyRuntime, load_snapshot
from scheduler.checks import binding_warnings, usable_key_exists
from scheduler.core.qos import QosClass
from superfluid_site.deploy import static_key_digest

STATIC = "container-secret-0123456789"


def static(**more: object) -> override_settings:
    return override_settings(**{"SUPERFLUID_API_KEY_SHA256": digest_of(STATIC), "SUPERFLUID_API_KEY_POLICY": "", **more})


async def auth(snapshot_loader: object, headers: dict[str, str]) -> object:
    rt = KeyRuntime(asyncio.get_running_loop(), watch=False)
    rt.snapshot = snapshot_loader  # type: ignore[assignment]
    rt.loaded.set()
    rt.touch = lambda key: None  # type: ignore[method-assign]
    return await authenticate(headers, ("10.0.0.9", 1), rt)


@pytest.mark.django_db
def test_the_static_key_is_accepted_under_its_name_and_a_wrong_one_is_refused_when_keys_are_required() -> None:
    with static(SUPERFLUID_KEYS_REQUIRED=True):
        snap = load_snapshot()
        principal = asyncio.run(auth(snap, {"authorization": f"Bearer {STATIC}"}))
        assert principal.key_name == STATIC_KEY_NAME  # type: ignore[attr-defined]
        assert principal.policy is None  # type: ignore[attr-defined]  # the server's defaults
        assert asyncio.run(auth(snap, {"x-api-key": STATIC})).key_name == STATIC_KEY_NAME  # type: ignore[attr-defined]
        for wrong in (STATIC + "x", STATIC[:-1], STATIC.upper()):
            with pytest.raises(ApiError) as err:
                asyncio.run(auth(snap, {"authorization": f"Bearer {wrong}"}))
            assert err.value.status == 401 and err.value.code == "invalid_api_key"
    with override_settings(SUPERFLUID_API_KEY_SHA256=""):
        assert load_snapshot().lookup(STATIC) is None


@pytest.mark.django_db
def test_the_static_key_follows_the_named_admin_policy_and_is_refused_while_that_policy_is_missing(caplog: pytest.LogCaptureFixture) -> None:
    with static(SUPERFLUID_API_KEY_POLICY="containers"):
        logger = logging.getLogger("superfluid.keys")  # "superfluid" does not propagate to caplog's root
        logger.addHandler(caplog.handler)
        try:
            assert load_snapshot().lookup(STATIC) is None  # never the server's (wider) defaults instead
        finally:
            logger.removeHandler(caplog.handler)
        assert "names no policy 'containers'" in caplog.text
        assert STATIC not in caplog.text
        actions.save_policy(KeyPolicy(name="containers", default_class=int(QosClass.BACKGROUND), max_class=int(QosClass.AGENT), is_admin=True))
        key = load_snapshot().lookup(STATIC)
        assert key is not None and key.policy is not None
        assert key.policy.default_class == QosClass.BACKGROUND and key.policy.is_admin


@pytest.mark.django_db
def test_an_admin_key_may_not_take_the_static_keys_name() -> None:
    with pytest.raises(ValidationError, match="static key"):
        actions.create_key(ApiKey(name=STATIC_KEY_NAME))
    with pytest.raises(ValidationError, match="without a key"):  # /metrics' label for keyless requests
        actions.create_key(ApiKey(name="anonymous"))
    # the access log's key= and the activity log's key filter for keyless requests: a key named so
    # could not be told from them (filtering the activity log on it showed the keyless rows)
    with pytest.raises(ValidationError, match="without a key"):
        actions.create_key(ApiKey(name="-"))


@pytest.mark.django_db
def test_the_static_key_counts_as_a_usable_key_for_the_binding_check() -> None:
    with override_settings(SUPERFLUID_API_KEY_SHA256=""):
        assert not usable_key_exists()
        assert binding_warnings("0.0.0.0", False)
    with static():
        assert usable_key_exists()
        assert binding_warnings("0.0.0.0", False) == []


@pytest.mark.parametrize("raw", ["short", "has a space in it 1234567", "0123456789abcde"])
def test_a_weak_or_malformed_static_key_stops_the_start_without_echoing_it(raw: str) -> None:
    from superfluid_site.env import EnvError

    with pytest.raises(EnvError, match="SUPERFLUID_API_KEY") as err:
        static_key_digest("SUPERFLUID_API_KEY", raw)
    assert raw not in str(err.value)


def test_only_the_digest_of_the_static_key_is_kept() -> None:
    assert static_key_digest("SUPERFLUID_API_KEY", f" {STATIC}\n") == digest_of(STATIC)
    assert static_key_digest("SUPERFLUID_API_KEY", "") == ""


@settings(max_examples=200)
@given(presented=st.text(min_size=1, max_size=60))
def test_nothing_but_the_static_key_itself_matches_it(presented: str) -> None:
    """Hostile keys: the snapshot's lookup (hash, then a constant-time confirmation) finds the
    static key for its exact secret only."""
    from keys.runtime import Key, Snapshot

    k = Key(id=-1, name=STATIC_KEY_NAME, digest=digest_of(STATIC))
    snap = Snapshot(version=1, keys_by_digest={k.digest: k})
    assert (snap.lookup(presented) is k) is (presented == STATIC)
    assert snap.lookup(STATIC) is k
