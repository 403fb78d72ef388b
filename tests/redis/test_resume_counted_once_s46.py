"""A stream resumed on another head (``Last-Event-ID``) while its first head still lives: the
client's connection to the first head died without that head seeing it yet (a network path
that went silent), and the client came back on another head. When the first head saw its client
gone it cancelled the job, which killed the stream the second head was sending (its client got
an error in place of the rest of its reply), and it wrote its own activity row (499, the tokens
so far) beside the second head's: the request counted twice in its key's requests and tokens.
Now the second head's marker on the job's stream hands the job over: the first head ends its
side, cancels nothing and writes no row; the request is counted once, by the head that has it."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from channels.testing import HttpCommunicator

from superfluid_site.runtime import forget, install

from .conftest import RedisServer, SimFleetWorker, completion, head
from .test_fleet_sim import slow_sim
from .test_resume_sim import deltas_until, texts_until_done

pytestmark = pytest.mark.django_db(transaction=True)


async def frames_until(comm: HttpCommunicator, count: int) -> bytes:
    """The body until ``count`` data frames came."""
    got = b""
    while got.count(b"data: {") < count:
        got += (await comm.receive_output(30)).get("body", b"")
    return got


async def rest(comm: HttpCommunicator) -> bytes:
    got = b""
    while True:
        message = await comm.receive_output(30)
        got += message.get("body", b"")
        if not message.get("more_body"):
            return got


async def test_a_stream_resumed_while_its_first_head_lives_is_finished_there_and_counted_once(
    monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer, prefix: str
) -> None:
    import api.consumers as consumers
    from superfluid_site.asgi import application

    rows: list[Any] = []

    async def keep(record: Any) -> None:
        rows.append(record)

    monkeypatch.setattr(consumers, "record_request", keep)
    worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.02)).start()
    first = second = None
    body = json.dumps({"model": "sim", "messages": [{"role": "user", "content": "a tale"}], "max_tokens": 120, "stream": True}).encode()
    headers = [(b"content-type", b"application/json"), (b"host", b"127.0.0.1")]
    try:
        first = install(await head(redis_server.url, prefix))
        to_first = HttpCommunicator(application, "POST", "/v1/chat/completions", body=body, headers=headers)
        await to_first.send_input({"type": "http.request", "body": body, "more_body": False})
        start = await to_first.receive_output(30)
        assert start["status"] == 200
        seen = await frames_until(to_first, 4)
        last_id = [line for line in seen.decode().splitlines() if line.startswith("id: ")][-1][4:]
        # the client's connection went silent; it comes back on another head
        second = install(await head(redis_server.url, prefix))
        to_second = HttpCommunicator(application, "POST", "/v1/chat/completions", body=body, headers=[*headers, (b"last-event-id", last_id.encode())])
        await to_second.send_input({"type": "http.request", "body": body, "more_body": False})
        assert (await to_second.receive_output(30))["status"] == 200
        await frames_until(to_second, 2)
        # the first head sees its client gone only now
        await to_first.send_input({"type": "http.disconnect"})
        await to_first.wait(30)  # its response ended: a row it writes is written by now
        tail = await rest(to_second)
        assert b'"finish_reason":"length"' in tail and tail.endswith(b"data: [DONE]\n\n"), tail[-400:]
        for _ in range(500):  # the second head's row, written as its response's task ends
            if any(r.status == 200 for r in rows):
                break
            await asyncio.sleep(0.01)
    finally:
        for link in (second, first):
            if link is not None:
                await link.stop()
        forget(asyncio.get_running_loop())
        worker.stop()
    assert [(r.status, r.finish_reason, r.usage.get("completion_tokens")) for r in rows] == [(200, "length", 120)], rows


async def test_a_cancel_from_the_head_a_job_was_taken_from_leaves_it_running(redis_server: RedisServer, prefix: str) -> None:
    """The first head's cancel reaches Redis before its reader read the taking head's marker:
    the job is the other head's (its hash says so), so it runs on and its stream is kept."""
    worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.02)).start()
    first = await head(redis_server.url, prefix)
    second = await head(redis_server.url, prefix)
    try:
        handle = await first.submit(request=completion("a tale", max_tokens=60), qos=2, priority=0)
        meta = {"key": None, "body": "b", "id": "chatcmpl-x", "created": 0, "qos": 2, "priority": 0, "started": time.time()}
        await first.remember_stream(handle.job_id, meta)
        await deltas_until(handle, 2)
        attached = await second.attach(handle.job_id)
        assert attached is not None
        taken, _meta = attached
        await first.scripts.cancel([first.prefix, handle.job_id, first.head_id])
        texts, event = await texts_until_done(taken)
        assert event.finish_reason == "length" and len(texts) == 60, (event, len(texts))
        second.finish(taken)
    finally:
        await second.stop()
        await first.stop()
        worker.stop()
