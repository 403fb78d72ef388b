"""The preemptions on the row of a request whose client left before its job's Done: the web
side had them (each Delta says how often the job was preempted so far), and its row said 0."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import ApplicationCommunicator

from activity import writer as activity_writer
from activity.models import ActivityEntry
from tests.edge.inproc import JSON, SimWorker, application, attached, chat_body, request, scope
from tests.edge.test_cancel_sweep import until

pytestmark = pytest.mark.django_db(transaction=True)


async def rows() -> list[dict[str, Any]]:
    assert await asyncio.to_thread(activity_writer.flush)
    return await sync_to_async(list)(ActivityEntry.objects.order_by("id").values("qos_class", "error_code", "preemptions", "completion_tokens"))


async def running_background_chat(link: Any, stream: bool) -> tuple[ApplicationCommunicator, Any]:
    """A background chat of 400 tokens, submitted and generating: its client and its handle."""
    comm = ApplicationCommunicator(application(), scope("POST", "/v1/chat/completions", [*JSON, (b"x-superfluid-qos", b"background")]))
    await comm.send_input({"type": "http.request", "body": chat_body("x", max_tokens=400, stream=stream), "more_body": False})
    await until(lambda: len(link.inflight) == 1, lambda: "the background job was never submitted")
    [handle] = list(link.inflight.values())
    await until(lambda: handle.delivered_tokens > 0, lambda: "the background job never ran")
    return comm, handle


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_that_leaves_after_its_job_was_preempted_and_resumed_has_the_preemption_on_its_row(stream: bool) -> None:
    """One lane: a background chat streams, an interactive chat parks it and ends, the
    background job resumes and sends more tokens (its Delta says preemptions=1), then its client
    leaves. Its row said preemptions=0: the one reason it waited, gone from the log."""
    async with attached(SimWorker(lanes=1, step_sleep_s=0.002)) as (link, _rt):
        comm, handle = await running_background_chat(link, stream)
        urgent = await request("POST", "/v1/chat/completions", chat_body("y", max_tokens=10), [*JSON, (b"x-superfluid-qos", b"interactive")], timeout_s=30)
        assert urgent.status == 200
        await until(lambda: handle.preemptions >= 1, lambda: "no delta said the job was preempted")
        assert link.worker.scheduler.counters["parks"] == 1
        await comm.send_input({"type": "http.disconnect"})
        await until(lambda: not link.inflight, lambda: "the background job was not cancelled")
    interactive, background = await rows()
    assert interactive["qos_class"] == "interactive" and interactive["preemptions"] == 0
    assert background["qos_class"] == "background" and background["error_code"] == "client_disconnected", background
    assert background["completion_tokens"] and background["completion_tokens"] > 0, background
    assert background["preemptions"] == 1, background


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_that_leaves_while_its_job_is_parked_has_the_preemption_on_its_row(stream: bool) -> None:
    """One lane: a background chat streams, an interactive chat parks it, and the background's
    client leaves while the interactive still runs, so its job never ran again. No Delta had
    come since the preemption (it sent no text), so its row said preemptions=0 though that was
    the whole of why it waited: the worker now says so when it parks a job."""
    async with attached(SimWorker(lanes=1, step_sleep_s=0.01)) as (link, _rt):
        background, handle = await running_background_chat(link, stream)
        interactive = ApplicationCommunicator(application(), scope("POST", "/v1/chat/completions", [*JSON, (b"x-superfluid-qos", b"interactive")]))
        await interactive.send_input({"type": "http.request", "body": chat_body("y", max_tokens=400, stream=True), "more_body": False})
        await until(lambda: handle.preemptions >= 1, lambda: "the head never heard that the job was preempted")
        assert link.worker.scheduler.jobs[handle.job_id].lane is None, "the background job runs again: the interactive ended"
        assert link.worker.scheduler.counters["parks"] == 1
        await background.send_input({"type": "http.disconnect"})
        await until(lambda: handle.job_id not in link.inflight, lambda: "the background job was not cancelled")
        await interactive.send_input({"type": "http.disconnect"})
        await until(lambda: not link.inflight, lambda: "the interactive job was not cancelled")
    first, second = await rows()
    assert first["qos_class"] == "background" and first["error_code"] == "client_disconnected", first
    assert first["preemptions"] == 1, first
    assert second["qos_class"] == "interactive" and second["preemptions"] == 0, second
