"""Edge refusals in the application layer (api/consumers.py): each leaves an activity row that
says why, and a huge body is parsed off the event loop so other streams keep being served."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.sync import sync_to_async
from channels.testing import ApplicationCommunicator
from django.test import override_settings

from activity import writer as activity_writer
from activity.models import ActivityEntry

from .inproc import JSON, MODEL, SimWorker, application, attached, chat_body, request, scope

pytestmark = pytest.mark.django_db(transaction=True)


async def rows() -> list[tuple[str, int, str]]:
    assert await asyncio.to_thread(activity_writer.flush)
    return await sync_to_async(list)(ActivityEntry.objects.values_list("endpoint", "status", "error_code"))


@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000)
async def test_a_413_leaves_an_activity_row_saying_why_without_the_body_being_read(sim: SimWorker) -> None:
    async with attached(sim):
        big = await request("POST", "/v1/chat/completions", chat_body("x" * 2000), JSON)
        assert big.status == 413
        comm = ApplicationCommunicator(application(), scope("POST", "/v1/completions", [*JSON, (b"content-length", b"5000000")]))
        await comm.send_input({"type": "http.request", "body": b"{", "more_body": True})
        assert (await comm.receive_output(5))["status"] == 413
        await comm.send_input({"type": "http.disconnect"})
        await comm.wait(5)
    assert sorted(await rows()) == [("chat", 413, "request_too_large"), ("completions", 413, "request_too_large")]


async def test_other_edge_refusals_leave_rows_too(sim: SimWorker) -> None:
    async with attached(sim):
        assert (await request("POST", "/v1/chat/completions", b"{not json", JSON)).status == 400
        assert (await request("POST", "/v1/chat/completions", chat_body(), [*JSON, (b"origin", b"http://evil.example")])).status == 403
        assert (await request("POST", "/v1/chat/completions", chat_body(), JSON, host=b"evil.example")).status == 400
    assert sorted(await rows()) == [("chat", 400, "invalid_host"), ("chat", 400, "invalid_json"), ("chat", 403, "origin_forbidden")]


@override_settings(SUPERFLUID_MAX_BODY_BYTES=16 * 1024 * 1024)
async def test_a_huge_body_is_parsed_off_the_event_loop_while_other_streams_are_served(sim: SimWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the 20,000-message body is being parsed, a small request is answered in full: the
    parse waits (in its thread) until that answer has come back. Were the parse on the event
    loop, the small request could not run meanwhile and the parse's wait would give up."""
    from api import consumers

    small_served = threading.Event()
    seen: list[bool] = []
    real_parse = consumers.parse_chat_request

    def parse(body: bytes, **kwargs: object):  # type: ignore[no-untyped-def]
        if len(body) > 100_000:
            seen.append(small_served.wait(10))  # a failsafe, never reached when it works
        return real_parse(body, **kwargs)

    monkeypatch.setattr(consumers, "parse_chat_request", parse)
    many = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}] * 20_000}).encode()
    async with attached(sim):
        huge_task = asyncio.ensure_future(request("POST", "/v1/chat/completions", many, JSON, timeout_s=30))
        while not seen and not huge_task.done() and not small_served.is_set():
            small = await request("POST", "/v1/chat/completions", chat_body(max_tokens=3, stream=True), JSON)
            assert small.status == 200 and small.sse_data()[-1] == "[DONE]"
            small_served.set()
        huge = await huge_task
    assert seen == [True]  # the small stream was served while the huge body was being parsed
    assert huge.status == 400 and huge.json()["error"]["code"] == "context_length_exceeded"


async def test_a_request_that_ends_without_a_done_keeps_the_time_it_was_open(sim: SimWorker) -> None:
    """A worker's refusal (or an error, or a wait for a model that never loads) brings no Done
    and so no worker timing: the row has how long the request was open, and no first token."""
    async with attached(sim):
        refused = await request("POST", "/v1/chat/completions", chat_body(max_tokens=10**6), JSON)
        assert refused.status == 400
    assert await asyncio.to_thread(activity_writer.flush)
    rows = await sync_to_async(list)(ActivityEntry.objects.values_list("status", "error_code", "ttft_ms", "total_ms"))
    assert len(rows) == 1 and rows[0][:3] == (400, "context_length_exceeded", None) and rows[0][3] > 0
