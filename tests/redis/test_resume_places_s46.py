"""A stream resumed on another head (``Last-Event-ID``) keeps the concurrency places its first
head's admission took in Redis: the head that resumes it holds them from then on, renews them and
gives them back when the response ends. Before, the resuming head held nothing ("not admitted
again"): the dead first head's places lapsed within a minute while the request still ran, and its
key (or keyless client) could run one more than its ``max_concurrent`` (``--client-concurrency``)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis
from channels.testing import HttpCommunicator
from django.test import override_settings

from api.admission import Principal, admit
from api.errors import ApiError
from api.schemas import GenerationRequest
from keys.limits import client_slot, shared_limiter
from superfluid_site.runtime import forget, install
from tests.edge.test_cancel_sweep import until

from .conftest import RedisServer, SimFleetWorker, completion, head
from .test_fleet_sim import slow_sim
from .test_resume_row import resume_notes
from .test_resume_sim import deltas_until

pytestmark = pytest.mark.django_db(transaction=True)

FIRST = "first-heads-member"


def chat() -> GenerationRequest:
    return GenerationRequest(endpoint="chat", model="sim", messages=[{"role": "user", "content": "hi"}], stream=True)


async def test_a_resumed_stream_holds_its_first_heads_place_until_it_ends(monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer, prefix: str) -> None:
    import api.consumers as consumers

    rows: list[Any] = []

    async def keep(record: Any) -> None:
        rows.append(record)

    monkeypatch.setattr(consumers, "record_request", keep)
    monkeypatch.setattr(consumers, "body_digest", lambda _request: "same-body")
    places = redis.Redis.from_url(redis_server.url)
    with override_settings(SUPERFLUID_REDIS_URL=redis_server.url, SUPERFLUID_CLIENT_CONCURRENCY=1, SUPERFLUID_MAX_QUEUE=0):
        slot = client_slot(Principal().client_id)  # (no client address: as HttpCommunicator sends)
        zset = f"sf:cc:{slot}"
        limiter = shared_limiter(redis_server.url)
        worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.02)).start()
        second = None
        try:
            first = await head(redis_server.url, prefix)
            # the first head admitted it (its keyless client's one place) and noted it for a resume
            assert await limiter.take([], [(slot, 1)], FIRST) == (0, 0.0)
            handle = await first.submit(request=completion("a tale", max_tokens=150), qos=0, priority=100)
            meta = {"key": None, "body": "same-body", "id": "chatcmpl-x", "created": int(time.time()), "qos": 0, "priority": 100,
                    "started": time.time(), "slots": [slot], "member": FIRST}
            await first.remember_stream(handle.job_id, meta)
            await deltas_until(handle, 3)
            await first.stop()  # the first head dies: it renews its places no more
            limiter.held.pop(FIRST, None)
            second = install(await head(redis_server.url, prefix))
            from superfluid_site.asgi import application

            body = json.dumps({"model": "sim", "messages": [{"role": "user", "content": "a tale"}], "max_tokens": 150, "stream": True}).encode()
            headers = [(b"content-type", b"application/json"), (b"host", b"127.0.0.1"), (b"last-event-id", f"{handle.job_id}:3".encode())]
            comm = HttpCommunicator(application, "POST", "/v1/chat/completions", body=body, headers=headers)
            await comm.send_input({"type": "http.request", "body": body, "more_body": False})
            assert (await comm.receive_output(30))["status"] == 200
            got = b""
            while b"data:" not in got:
                got += (await comm.receive_output(30)).get("body", b"")
            # the first head's place lapses (its minute is up; the same as its member leaving)
            places.zrem(zset, FIRST)
            # the resumed request still runs: the client's one place is taken, by it
            with pytest.raises(ApiError) as refused:
                await admit({}, None, chat())
            assert refused.value.code == "concurrency_limit_exceeded", refused.value
            assert places.zcard(zset) == 1
            while True:  # the rest of the stream
                message = await comm.receive_output(30)
                if not message.get("more_body"):
                    break
            await until(lambda: places.zcard(zset) == 0, lambda: places.zrange(zset, 0, -1))  # given back at its end
            again = await admit({}, None, chat())
            await again.release()
        finally:
            if second is not None:
                await second.stop()
            forget(asyncio.get_running_loop())
            worker.stop()
            places.close()
    assert [r.status for r in rows] == [200]


async def test_a_streams_resume_note_names_the_places_its_request_holds(monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer, prefix: str) -> None:
    """What the head that resumes a stream needs to hold its places: the first head notes them."""
    from superfluid_site.asgi import application

    worker = SimFleetWorker(redis_server.url, prefix).start()
    with override_settings(SUPERFLUID_REDIS_URL=redis_server.url, SUPERFLUID_CLIENT_CONCURRENCY=2):
        link = install(await head(redis_server.url, prefix))
        notes = resume_notes(monkeypatch, link)
        try:
            body = json.dumps({"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}).encode()
            comm = HttpCommunicator(application, "POST", "/v1/chat/completions", body=body, headers=[(b"content-type", b"application/json"), (b"host", b"127.0.0.1")])
            response = await comm.get_response(timeout=30)
            assert response["status"] == 200, response
            (meta,) = notes
            slot = client_slot(Principal().client_id)
            assert meta["slots"] == [slot] and isinstance(meta["member"], str) and meta["member"], meta
        finally:
            await link.stop()
            forget(asyncio.get_running_loop())
            worker.stop()
