"""Review of session 41's changes: each test here failed on the code as the session left it."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
from channels.testing import HttpCommunicator

from superfluid_site.runtime import forget, install
from tests.redis.conftest import RedisServer, SimFleetWorker, completion, head, prefix, redis_server  # noqa: F401 (fixtures)
from tests.redis.test_fleet_sim import slow_sim
from tests.redis.test_resume_sim import deltas_until

TIMES = ("queue_wait_ms", "ttft_ms", "total_ms")


@pytest.mark.django_db(transaction=True)
async def test_a_stream_resumed_on_a_head_that_waited_for_a_worker_keeps_the_workers_times(
    monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer, prefix: str  # noqa: F811
) -> None:
    """Redis mode: a client resumes its stream (Last-Event-ID) on a head whose link waited for a
    worker before it could take the request (here a minute, on the consumer's own clock). That
    wait came after the job was submitted (by the first head, which told its worker its own
    wait in the Submit): the resuming head submits nothing, so its wait is none of the job's.
    It was added to the row's queue wait, time to first token and total time as a wait before
    the Submit (``router_wait``), a minute that never was."""
    import api.consumers as consumers

    rows: list[Any] = []
    dones: list[Any] = []

    async def keep(record: Any) -> None:
        rows.append(record)

    real_note_done = consumers.GenerationConsumer.note_done

    def note_done(self: Any, event: Any) -> None:
        dones.append(event)
        real_note_done(self, event)

    monkeypatch.setattr(consumers, "record_request", keep)
    monkeypatch.setattr(consumers, "body_digest", lambda _request: "same-body")
    monkeypatch.setattr(consumers.GenerationConsumer, "note_done", note_done)
    ticks = itertools.count()  # each reading a minute after the one before
    monkeypatch.setattr(consumers, "time", SimpleNamespace(time=time.time, monotonic=lambda: 60.0 * next(ticks)))
    worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.005)).start()
    second = None
    try:
        first = await head(redis_server.url, prefix)
        began = time.time()
        handle = await first.submit(request=completion("a tale", max_tokens=40), qos=1, priority=7)
        meta = {"key": None, "body": "same-body", "id": "chatcmpl-x", "created": int(began), "qos": 1, "priority": 7, "started": began}
        await first.remember_stream(handle.job_id, meta)
        await deltas_until(handle, 3)
        await first.stop()  # the first head dies
        second = install(await head(redis_server.url, prefix))
        from superfluid_site.asgi import application

        body = json.dumps({"model": "sim", "messages": [{"role": "user", "content": "a tale"}], "max_tokens": 40, "stream": True}).encode()
        headers = [(b"content-type", b"application/json"), (b"host", b"127.0.0.1"), (b"last-event-id", f"{handle.job_id}:3".encode())]
        comm = HttpCommunicator(application, "POST", "/v1/chat/completions", body=body, headers=headers)
        response = await comm.get_response(timeout=30)
        assert response["status"] == 200 and b"[DONE]" in response["body"], response
    finally:
        if second is not None:
            await second.stop()
        forget(asyncio.get_running_loop())
        worker.stop()
    (row,) = rows
    (done,) = dones
    assert {k: row.timing[k] for k in TIMES} == {k: done.timing[k] for k in TIMES}, (row.timing, done.timing)
