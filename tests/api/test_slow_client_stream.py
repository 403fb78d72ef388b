"""A streaming client that stops reading: the response does not wait on it (nothing in the
consumer waits for the client to take a write), so its jobs end at the engine's pace, their
lanes free and the request's row is written as for a client that read everything."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from channels.testing import ApplicationCommunicator

from activity.models import ActivityEntry
from tests.edge.inproc import JSON, SimWorker, application, attached, chat_body, scope

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_client_that_never_reads_its_stream_holds_no_lane_and_gets_a_whole_row() -> None:
    sim = SimWorker(lanes=2, step_sleep_s=0.002)
    async with attached(sim):
        comm = ApplicationCommunicator(application(), scope("POST", "/v1/chat/completions", JSON))
        body = chat_body(max_tokens=40, stream=True, n=2, stream_options={"include_usage": True})
        await comm.send_input({"type": "http.request", "body": body, "more_body": False})
        # nothing is read: the response still ends, its jobs run to their end and its row is written
        deadline = time.monotonic() + 20
        rows: list[tuple[int, str, int]] = []
        while not rows and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            rows = await sync_to_async(list)(ActivityEntry.objects.values_list("status", "finish_reason", "completion_tokens"))
        assert rows == [(200, "length", 80)]
        assert sim.busy() == (0, 0)
        assert sim.transport is not None and sim.transport.worker is not None
        counters = sim.transport.worker.scheduler.counters
        assert (counters["finished"], counters["cancelled"]) == (2, 0)
        # everything was written for it, ending in [DONE]
        out = []
        while not comm.output_queue.empty():
            out.append(comm.output_queue.get_nowait())
        assert out[0]["type"] == "http.response.start" and not out[-1].get("more_body")
        assert b"".join(m.get("body", b"") for m in out[1:]).endswith(b"data: [DONE]\n\n")
        await comm.send_input({"type": "http.disconnect"})
        await comm.wait(10)
