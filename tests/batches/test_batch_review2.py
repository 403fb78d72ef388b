"""Second review of the Batch API: a cancel of a batch that has ended (OpenAI: 409), a reply that
lands while its runner looks for a cancel, a Celery worker's database connection dropped under
it, and a large batch's lines stored exactly."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.test import Client
from django.utils import timezone

from batches import runner, tasks, views
from batches.models import Batch, File, Line

pytestmark = pytest.mark.django_db(transaction=True)


def make_batch(n: int, status: str = "validating") -> Batch:
    f = File.objects.create(purpose="batch", filename="in.jsonl", bytes=1, content=b"x", owner="")
    b = Batch.objects.create(endpoint="/v1/completions", input_file=f, owner="", total=n, status=status)
    Line.objects.bulk_create([Line(batch=b, index=i, custom_id=f"c{i}", body={"prompt": "p"}) for i in range(n)])
    return b


def test_cancelling_a_batch_that_has_ended_is_409_as_openai_answers() -> None:
    """OpenAI refuses it: 409 (the SDK's ConflictError) "Cannot cancel a batch with status
    'completed'." The cancel answered 200 with the batch unchanged, which a client took for a
    cancel that worked."""
    client = Client()
    for status in ("completed", "failed", "expired", "cancelled"):
        b = make_batch(1, status=status)
        r = client.post(f"/v1/batches/{b.id}/cancel")
        assert r.status_code == 409, (status, r.content)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"] == f"Cannot cancel a batch with status '{status}'."
        assert Batch.objects.get(pk=b.id).status == status
    # one still running is cancelled; asked again while it winds down, the answer is the same
    b = make_batch(2, status="in_progress")
    Line.objects.filter(batch=b, index=0).update(claimed_until=timezone.now() + runner.lease())  # in flight
    for _ in range(2):
        r = client.post(f"/v1/batches/{b.id}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "cancelling", r.content
    # one with nothing in flight is cancelled at once by this very call: 200, cancelled
    b = make_batch(1, status="in_progress")
    r = client.post(f"/v1/batches/{b.id}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled", r.content


class _ReplyDuringTheLook:
    """A consumer whose reply is sent while the runner is in its look for a cancel (the
    database read in a thread): the look then sees the batch cancelling."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.replied = threading.Event()

    def as_asgi(self) -> Any:
        async def app(_scope: Any, receive: Any, send: Any) -> None:
            await receive()
            await self.go.wait()
            body = json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "done"}]}).encode()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json"), (b"x-request-id", b"req-1")]})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            self.replied.set()
            await receive()  # the disconnect after the reply

        return app


async def test_a_reply_that_lands_while_the_runner_looks_for_a_cancel_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner polls the batch's status while a line runs. A reply that was complete by the
    time that look answered "cancelling" was thrown away (the line given up, not recorded):
    its tokens were spent and the cancelled batch's output file lacked a line that had ended."""
    monkeypatch.setattr("activity.writer.submit", lambda _row: None)
    monkeypatch.setattr(runner, "POLL_S", 0.01)
    consumer = _ReplyDuringTheLook()
    monkeypatch.setattr("api.consumers.CompletionsConsumer", consumer)
    loop = asyncio.get_running_loop()

    def status_while_the_reply_lands(_batch_id: str) -> str:
        loop.call_soon_threadsafe(consumer.go.set)
        assert consumer.replied.wait(10)
        return "cancelling"

    b = await sync_to_async(make_batch)(1, "in_progress")
    line = await Line.objects.aget(batch=b, index=0)
    monkeypatch.setattr(runner, "current_status", status_while_the_reply_lands)
    ok, result = await asyncio.wait_for(runner.run_line(b, line), 30)
    assert ok and result is not None, result
    assert result["custom_id"] == "c0" and result["response"]["status_code"] == 200
    assert result["response"]["body"]["choices"][0]["text"] == "done"


def test_a_celery_worker_gets_over_a_dropped_database_connection() -> None:
    """A Celery worker runs its lines on one event loop whose database calls share one thread
    (batches/tasks.py run_async): nothing ever closed that thread's connection, so once the
    database dropped it (PostgreSQL restarted, an idle timeout) every later task of every batch
    failed on it ("connection already closed"), for good. Each line now starts and ends with
    Django's close_old_connections, as a request does."""
    b = make_batch(2, status="cancelling")  # nothing in flight: a task claims nothing
    assert tasks.run_async(runner.run_next(b.id)) is False

    def drop() -> None:
        connection.ensure_connection()
        connection.connection.close()  # gone under Django, which still holds it

    tasks.run_async(sync_to_async(drop)())
    assert tasks.run_async(runner.run_next(b.id)) is False
    assert tasks.run_async(runner.run_next(b.id)) is False


def test_a_batchs_lines_are_stored_exactly_as_the_file_holds_them() -> None:
    """The lines are written in one statement made ready before the transaction (a 50,000-line
    batch held SQLite's write lock about 3 s while model rows were built and bulk-created; about
    0.4 s now): each line's body keeps its keys' order and every character, and is pending."""
    bodies = [{"prompt": "p\u0000q", "z": 1, "a": [1.5, None, True]}, {"messages": [{"role": "user", "content": "héllo \u2028 😀"}], "b": {"y": 2, "x": 1}}]
    data = "".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions", "body": body}) + "\n" for i, body in enumerate(bodies))
    f = File.objects.create(purpose="batch", filename="in.jsonl", bytes=len(data), content=data.encode(), owner="k")
    b = views._create("k", "localhost", f.id, "/v1/completions", "24h", None)
    rows = list(Line.objects.filter(batch=b).order_by("index"))
    assert [(x.index, x.custom_id, x.done, x.ok, x.claimed_until, x.result) for x in rows] == [(0, "c0", False, False, None, None), (1, "c1", False, False, None, None)]
    assert [json.dumps(x.body) for x in rows] == [json.dumps(body) for body in bodies]  # key order kept
    assert (b.status, b.total, b.owner) == ("validating", 2, "k")
    runner.begin(b.id)
    line = runner.claim(b.id)
    assert line is not None and line.custom_id == "c0" and line.body == bodies[0]
