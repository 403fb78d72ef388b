"""A running web process's key runtime, watching the database as the server does (no fixed
snapshot): a key revoked, rotated or expired by another process (``manage.py revokekey``, the
admin of another head) is refused within about ``POLL_S``, without any poke in this process."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db.models import F
from django.test import override_settings
from django.utils import timezone

from api.admission import authenticate
from api.errors import ApiError
from keys.credentials import digest_of, display_prefix, new_secret
from keys.runtime import POLL_S, KeyRuntime

IP = ("10.0.0.7", 5555)


def _elsewhere(**fields: object) -> None:
    """A change committed by another process: the row and the version, and no poke here."""
    from keys.models import ApiKey, ConfigVersion

    ApiKey.objects.filter(name="alice").update(**fields)
    if ConfigVersion.objects.filter(pk=1).update(version=F("version") + 1) == 0:
        ConfigVersion.objects.create(pk=1, version=1)


async def _refused_within(rt: KeyRuntime, headers: dict[str, str], seconds: float) -> str:
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        try:
            await authenticate(headers, IP, rt)
        except ApiError as exc:
            return exc.message
        assert asyncio.get_running_loop().time() < deadline, "still served"
        await asyncio.sleep(0.02)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("change", ["revoked", "rotated", "expired"])
async def test_a_key_changed_by_another_process_is_refused_within_a_poll(change: str) -> None:
    from keys.models import ApiKey

    secret = new_secret()
    await ApiKey.objects.acreate(name="alice", digest=digest_of(secret), prefix=display_prefix(secret))
    rt = KeyRuntime(asyncio.get_running_loop(), link=None)
    rt.touch = lambda key: None  # type: ignore[method-assign]
    try:
        assert (await authenticate({"authorization": f"Bearer {secret}"}, IP, rt)).key_name == "alice"
        other = new_secret()
        fields = {"revoked": {"revoked": True}, "rotated": {"digest": digest_of(other), "prefix": display_prefix(other)},
                  "expired": {"expires": timezone.now() - timedelta(seconds=1)}}[change]
        await sync_to_async(_elsewhere, thread_sensitive=False)(**fields)
        with override_settings(SUPERFLUID_KEYS_REQUIRED=True):
            message = await _refused_within(rt, {"authorization": f"Bearer {secret}"}, 4 * POLL_S + 4)  # generous: a loaded machine
            assert change[:-1] in message or change == "rotated"
            if change == "rotated":
                assert (await authenticate({"x-api-key": other}, IP, rt)).key_name == "alice"
    finally:
        await rt.stop()
