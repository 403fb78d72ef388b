"""A generation request the protocol layer refuses (a body over --max-body-bytes, one that
trickles in past --body-timeout, a client that leaves while sending it) is logged under the key
it came with, as the application logs a request it refuses: its activity row said no key, and
/metrics counted its rejection for key="anonymous", so an operator asking why a key's requests
failed found none of these (served, they hit the edge, not the application's own 413)."""

from __future__ import annotations

import asyncio
import datetime

import pytest
from asgiref.sync import sync_to_async
from django.test import override_settings
from django.utils import timezone

from activity import writer as activity_writer
from activity.models import ActivityEntry
from api.metrics import web_metrics
from keys.credentials import digest_of
from keys.runtime import Key, KeyRuntime, Snapshot
from superfluid_site.runtime import forget, web_runtime
from tests.edge.test_request_bounds import BODY, connect, head, reply

pytestmark = pytest.mark.django_db(transaction=True)

SECRETS = {"live": "sf-edge-live-0123456789", "revoked": "sf-edge-revoked-0123456789", "expired": "sf-edge-expired-0123456789"}


def keys() -> dict[str, Key]:
    past = timezone.now() - datetime.timedelta(days=1)
    made = {
        "live": Key(id=1, name="edge-live", digest=digest_of(SECRETS["live"])),
        "revoked": Key(id=2, name="edge-revoked", digest=digest_of(SECRETS["revoked"]), revoked=True),
        "expired": Key(id=3, name="edge-expired", digest=digest_of(SECRETS["expired"]), expires=past),
    }
    return {k.digest: k for k in made.values()}


def with_key(raw_head: bytes, header: bytes) -> bytes:
    return raw_head.replace(b"\r\n\r\n", b"\r\n" + header + b"\r\n\r\n", 1)


async def logged_keys() -> list[str]:
    assert await asyncio.to_thread(activity_writer.flush)
    return await sync_to_async(list)(ActivityEntry.objects.order_by("pk").values_list("key_name", flat=True))


@pytest.fixture
async def key_runtime():  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    rt = KeyRuntime(loop, watch=False)
    rt.snapshot = Snapshot(version=1, keys_by_digest=keys())
    rt.loaded.set()
    web_runtime().set_keys(rt)
    web_metrics.reset()
    try:
        yield rt
    finally:
        forget(loop)


@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000)
@pytest.mark.parametrize(
    ("header", "logged"),
    [
        (b"Authorization: Bearer " + SECRETS["live"].encode(), "edge-live"),
        (b"x-api-key: " + SECRETS["live"].encode(), "edge-live"),
        (b"Authorization: Bearer " + SECRETS["revoked"].encode(), ""),  # refused keys: none, as the application's rows
        (b"Authorization: Bearer " + SECRETS["expired"].encode(), ""),
        (b"Authorization: Bearer sf-nobody-knows-this-one", ""),
    ],
    ids=["bearer", "x-api-key", "revoked", "expired", "unknown"],
)
async def test_a_body_over_the_bound_refused_at_the_edge_is_logged_under_its_key(key_runtime: KeyRuntime, header: bytes, logged: str) -> None:
    server, protocol, transport, clock = connect()
    protocol.dataReceived(with_key(head(10**12), header))
    assert reply(transport)[0] == 413 and server.scopes == []
    assert await logged_keys() == [logged]
    assert web_metrics.key_rejections == {(logged or "anonymous", "request_too_large"): 1}


@override_settings(SUPERFLUID_BODY_TIMEOUT=30)
async def test_a_body_cut_off_or_left_half_sent_is_logged_under_its_key(key_runtime: KeyRuntime) -> None:
    from twisted.internet.error import ConnectionDone
    from twisted.python.failure import Failure

    auth = b"Authorization: Bearer " + SECRETS["live"].encode()
    server, protocol, transport, clock = connect()
    protocol.dataReceived(with_key(head(len(BODY)), auth) + BODY[:5])
    clock.advance(30)  # --body-timeout: 408
    assert reply(transport)[0] == 408
    server, protocol, transport, clock = connect()
    protocol.dataReceived(with_key(head(len(BODY)), auth) + BODY[:5])
    protocol.connectionLost(Failure(ConnectionDone()))  # the client left while sending it: 499
    assert server.scopes == []
    assert await logged_keys() == ["edge-live", "edge-live"]
    assert web_metrics.key_requests == {("edge-live", "chat", "none"): 2}
