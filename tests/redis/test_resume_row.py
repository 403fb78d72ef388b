"""The activity row of a stream a client resumed on another head (``Last-Event-ID``), written by
the head that took it over."""

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
from .test_resume_sim import deltas_until

pytestmark = pytest.mark.django_db(transaction=True)


class _Resumed:
    """A stream whose first head died after 3 deltas, and the head its client comes back to
    (``Last-Event-ID``), 0.3 s later; the activity rows the heads write are kept in ``rows``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import api.consumers as consumers

        self.rows: list[Any] = []

        async def keep(record: Any) -> None:
            self.rows.append(record)

        monkeypatch.setattr(consumers, "record_request", keep)
        monkeypatch.setattr(consumers, "body_digest", lambda _request: "same-body")

    async def start(self, redis_server: RedisServer, prefix: str, step_s: float, max_tokens: int) -> None:
        self.worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(step_s)).start()
        first = await head(redis_server.url, prefix)
        self.began = time.time()
        self.handle = await first.submit(request=completion("a tale", max_tokens=max_tokens), qos=1, priority=7)
        meta = {"key": None, "body": "same-body", "id": "chatcmpl-x", "created": int(self.began), "qos": 1, "priority": 7, "started": self.began}
        await first.remember_stream(self.handle.job_id, meta)
        await deltas_until(self.handle, 3)
        await asyncio.sleep(0.3)  # the client reconnects a while after its head died
        await first.stop()
        self.second = install(await head(redis_server.url, prefix))
        from superfluid_site.asgi import application

        body = json.dumps({"model": "sim", "messages": [{"role": "user", "content": "a tale"}], "max_tokens": max_tokens, "stream": True}).encode()
        headers = [(b"content-type", b"application/json"), (b"host", b"127.0.0.1"), (b"last-event-id", f"{self.handle.job_id}:3".encode())]
        self.body = body
        self.comm = HttpCommunicator(application, "POST", "/v1/chat/completions", body=body, headers=headers)

    async def native_frames(self, redis_server: RedisServer, prefix: str, prompt: Any, max_tokens: int = 40) -> list[dict[str, Any]]:
        """The frames of a streamed /completion of ``prompt`` resumed on the second head (its
        job the one the first head began), put together."""
        from superfluid_site.asgi import application

        try:
            await self.start(redis_server, prefix, 0.005, max_tokens)
            body = json.dumps({"prompt": prompt, "n_predict": max_tokens, "stream": True}).encode()
            headers = [(b"content-type", b"application/json"), (b"host", b"127.0.0.1"), (b"last-event-id", f"{self.handle.job_id}:3".encode())]
            response = await HttpCommunicator(application, "POST", "/completion", body=body, headers=headers).get_response(timeout=30)
        finally:
            await self.stop()
        assert response["status"] == 200, response
        return [json.loads(line[6:]) for line in response["body"].decode().splitlines() if line.startswith("data: ")]

    async def stop(self) -> None:
        await self.second.stop()
        forget(asyncio.get_running_loop())
        self.worker.stop()


async def test_a_resumed_streams_row_has_its_class_and_the_requests_times(monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer, prefix: str) -> None:
    resumed = _Resumed(monkeypatch)
    try:
        await resumed.start(redis_server, prefix, 0.005, 60)
        response = await resumed.comm.get_response(timeout=30)
        assert response["status"] == 200, response
        assert b"[DONE]" in response["body"]
        ended = time.time()
    finally:
        await resumed.stop()
    rows, began = resumed.rows, resumed.began
    (row,) = rows
    # the class it ran in, as the first head's row would have said (the activity log's filters)
    assert row.qos == "completion" and row.priority == 7, row
    # its times and its row's time from the client's arrival at the first head: the row does not
    # say it began when the client came back while its total counts from the first arrival
    assert abs(row.started_s - began) < 0.05, (row.started_s, began)
    assert row.started_s + row.timing["total_ms"] / 1000 <= ended + 0.05, (row, ended)
    assert row.timing["total_ms"] >= 300, row.timing


def resume_notes(monkeypatch: pytest.MonkeyPatch, link: Any) -> list[dict[str, Any]]:
    """The resume notes ``link`` leaves for its streams (remember_stream's meta), as they are left."""
    notes: list[dict[str, Any]] = []
    real = link.remember_stream

    async def note(job_id: str, meta: dict[str, Any]) -> None:
        notes.append(meta)
        await real(job_id, meta)

    monkeypatch.setattr(link, "remember_stream", note)
    return notes


async def test_a_streams_resume_note_carries_its_clients_arrival(monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer, prefix: str) -> None:
    """What the head that takes a stream over needs for the row above: the first head notes it."""
    from superfluid_site.asgi import application

    worker = SimFleetWorker(redis_server.url, prefix).start()
    link = install(await head(redis_server.url, prefix))
    notes = resume_notes(monkeypatch, link)
    try:
        began = time.time()
        body = json.dumps({"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}).encode()
        comm = HttpCommunicator(application, "POST", "/v1/chat/completions", body=body, headers=[(b"content-type", b"application/json"), (b"host", b"127.0.0.1")])
        response = await comm.get_response(timeout=30)
        assert response["status"] == 200, response
    finally:
        await link.stop()
        forget(asyncio.get_running_loop())
        worker.stop()
    (meta,) = notes
    assert began - 0.05 <= meta["started"] <= time.time(), meta
    assert meta["priority"] == 0, meta


async def test_a_resumed_stream_its_client_left_has_its_times_from_its_first_arrival(monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer, prefix: str) -> None:
    """No Done came (the client left the resumed stream too): the row's times are what the web
    side saw, from the client's first arrival; its first token came from the first head, at a
    time this head does not know, so no time to it is made up from the first token this head sent."""
    resumed = _Resumed(monkeypatch)
    try:
        await resumed.start(redis_server, prefix, 0.02, 200)
        accepted = resumed.handle.prompt_tokens  # as the worker accepted it, seen by the first head
        comm = resumed.comm
        await comm.send_input({"type": "http.request", "body": resumed.body, "more_body": False})
        start = await comm.receive_output(30)
        assert start["status"] == 200
        got = b""
        while b"data:" not in got:
            got += (await comm.receive_output(30)).get("body", b"")
        await comm.send_input({"type": "http.disconnect"})
        for _ in range(200):
            if resumed.rows:
                break
            await asyncio.sleep(0.02)
    finally:
        await resumed.stop()
    rows, began = resumed.rows, resumed.began
    (row,) = rows
    assert row.finish_reason is None and row.qos == "completion", row
    assert row.timing["total_ms"] >= 300 and abs(row.started_s - began) < 0.05, row
    assert row.timing["ttft_ms"] is None, row.timing
    # like any request that ended without its worker's Done, its prompt's tokens as its worker
    # accepted them (the resuming head read the job's stream from its start, the Accepted
    # included), so its key's token counts have them too
    assert accepted and row.usage.get("prompt_tokens") == accepted, row.usage
    assert row.usage.get("completion_tokens", 0) >= 3, row.usage
