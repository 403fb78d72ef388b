"""Activity rows of requests run through the real ASGI application and worker loop (the
in-process middle layer, tests/edge/inproc.py): what each row says about why a request waited."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import override_settings

from activity import writer as activity_writer
from activity.models import ActivityEntry
from tests.edge.inproc import JSON, MODEL, SimWorker, attached, chat_body, request, stand_in_pool

pytestmark = pytest.mark.django_db(transaction=True)

ROUTER_WAIT_S = 2.5


async def rows(*fields: str) -> list[dict[str, Any]]:
    assert await asyncio.to_thread(activity_writer.flush)
    return await sync_to_async(list)(ActivityEntry.objects.order_by("id").values(*fields))


def router_that_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several models: a router that dispatches every request after it waited ROUTER_WAIT_S (a
    model load), to the in-process worker."""
    from scheduler.core.router import Dispatch
    from superfluid_site.runtime import get_link

    async def acquire(model: str, priority: int, _jobs: int) -> Any:
        return get_link(), Dispatch("r", model, priority, "normal", 12.5, ROUTER_WAIT_S), 1

    stand_in_pool(monkeypatch, acquire)


async def test_the_serial_wait_of_a_request_of_several_choices_is_its_first_choices_as_its_queue_wait() -> None:
    """n=3 on one lane: the row's queue wait is the first choice's (it was admitted at once), but
    its serial_* fields were the last choice's to finish, which had waited behind its siblings:
    serial_queue_wait_ms said the request waited most of its total time for a lane."""
    async with attached(SimWorker(lanes=1)):
        reply = await request("POST", "/v1/chat/completions", chat_body("x", n=3, max_tokens=30), JSON, timeout_s=30)
        assert reply.status == 200 and {c["finish_reason"] for c in reply.json()["choices"]} == {"length"}
    [row] = await rows("queue_wait_ms", "total_ms", "serial_queue_wait_ms", "serial_score", "finish_reason", "completion_tokens")
    assert row["queue_wait_ms"] * 3 < row["total_ms"], row
    assert row["serial_queue_wait_ms"] == row["queue_wait_ms"], row
    assert (row["finish_reason"], row["completion_tokens"]) == ("length", 90)


async def test_an_embeddings_request_that_waited_at_the_model_router_keeps_that_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """With several models an embeddings request waits at the router (a swap, a load) like any
    other: its row had the router's serial_queue_wait_ms but no queue wait at all, where a chat
    request's row counts the router's wait in its queue_wait_ms."""
    from tests.edge.test_middle_layer import embedding_engine, embeddings_body

    router_that_waits(monkeypatch)
    async with attached(SimWorker()) as (link, _rt):
        embedding_engine(link)
        embedded = await request("POST", "/v1/embeddings", embeddings_body(["one", "two"]), JSON)
        chat = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON)
        assert (embedded.status, chat.status) == (200, 200), (embedded.body, chat.body)
    emb, chat_row = await rows("endpoint", "queue_wait_ms", "serial_queue_wait_ms", "total_ms", "prompt_tokens", "status")
    assert chat_row["queue_wait_ms"] == chat_row["serial_queue_wait_ms"] == ROUTER_WAIT_S * 1000  # as before
    assert emb["endpoint"] == "embeddings" and emb["status"] == 200 and emb["prompt_tokens"] == 6
    assert emb["queue_wait_ms"] == emb["serial_queue_wait_ms"] == ROUTER_WAIT_S * 1000, emb
    assert emb["total_ms"] is not None


@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000)
async def test_a_body_the_consumer_refuses_as_too_large_has_the_time_it_was_open() -> None:
    """Every refusal's row says how long its request was open (total_ms), as the protocol
    layer's 413 does; the consumer's own 413 (a chunked body over the bound) left it empty."""
    async with attached(SimWorker()):
        big = await request("POST", "/v1/chat/completions", json.dumps({"model": MODEL, "prompt": "x" * 2000}).encode(), JSON)
        bad = await request("POST", "/v1/chat/completions", b"{", JSON)
        assert (big.status, bad.status) == (413, 400)
    too_large, invalid = await rows("status", "error_code", "total_ms")
    assert (too_large["status"], too_large["error_code"]) == (413, "request_too_large")
    assert invalid["total_ms"] is not None  # any other refusal
    assert too_large["total_ms"] is not None and too_large["total_ms"] >= 0, too_large


async def test_a_request_refused_for_its_class_or_its_limits_is_logged_with_the_class_and_priority_decided() -> None:
    """A 403 for a class above the key's best and a 429 past its rate limit: the rows had no
    class, priority or band, so the log could not say which class a refused request was."""
    from keys.credentials import digest_of
    from keys.snapshot import Key, Policy

    secret = "sf-test-refused-0123456789"
    policy = Policy(name="agents", rate_limit_rpm=1, priority_offset=5)
    keyed = [*JSON, (b"authorization", f"Bearer {secret}".encode())]
    async with attached(SimWorker(), keys={digest_of(secret): Key(id=1, name="agent", digest=digest_of(secret), policy=policy)}):
        too_high = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), [*keyed, (b"x-superfluid-qos", b"interactive")])
        served = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), keyed)
        limited = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), keyed)
        assert (too_high.status, served.status, limited.status) == (403, 200, 429)
    found = await rows("status", "error_code", "qos_class", "priority", "band")
    assert [(r["status"], r["error_code"]) for r in found] == [(403, "qos_class_forbidden"), (200, ""), (429, "rate_limit_exceeded")]
    assert found[0]["qos_class"] == "interactive"  # the class it asked for
    assert [(r["qos_class"], r["priority"], r["band"]) for r in found[1:]] == [("agent", 5, "normal")] * 2
