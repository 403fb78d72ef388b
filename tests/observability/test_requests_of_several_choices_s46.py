"""The seed's llamaswap_scheduler_* count requests (request-priority.md: "requests waiting",
"requests dispatched"): a request of n choices (or several prompts) is one request there, at one
model's worker as at the model router, which dispatches each request once. Through the
in-process middle layer (tests/edge/inproc.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from api.metrics import snapshot_families
from tests.edge.inproc import JSON, SimWorker, attached, chat_body, request
from tests.edge.test_cancel_sweep import until

pytestmark = pytest.mark.django_db(transaction=True)


def by_band(snapshot: dict[str, Any], name: str) -> dict[str, float]:
    return {s.labels["band"]: s.value for f in snapshot_families(snapshot) for s in f.samples if s.name == name}


@pytest.mark.parametrize("body", [chat_body("x", n=3, max_tokens=6), json.dumps({"model": "sim", "prompt": ["a", "b"], "n": 2, "max_tokens": 4}).encode()],
                         ids=["chat-n3", "completions-2-prompts-n2"])
async def test_a_request_of_several_choices_is_dispatched_once(body: bytes) -> None:
    path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
    async with attached(SimWorker(lanes=1)) as (link, _rt):
        reply = await request("POST", path, body, JSON, timeout_s=30)
        assert reply.status == 200, reply.body
        assert len(reply.json()["choices"]) > 1
        reply = await request("POST", "/v1/chat/completions", chat_body("y", max_tokens=3), JSON, timeout_s=30)
        assert reply.status == 200
        worker = link.worker
        assert worker.scheduler.counters["admitted"] > 2  # every job ran in the one lane
        assert by_band(worker.snapshot(), "llamaswap_scheduler_dispatched_total") == {"interactive": 0, "normal": 2, "batch": 0}


async def test_the_choices_of_one_request_waiting_are_one_request_waiting() -> None:
    """One lane: the first of three choices runs, the other two wait for it: one request waits
    (llamaswap_scheduler_queue_depth), two jobs (superfluid_queue_depth)."""
    async with attached(SimWorker(lanes=1, step_sleep_s=0.004)) as (link, _rt):
        pending = asyncio.ensure_future(request("POST", "/v1/chat/completions", chat_body("x", n=3, max_tokens=40), JSON, timeout_s=30))

        def running_and_queued() -> tuple[int, int]:
            sched = link.worker.scheduler
            return sum(1 for job in sched.lanes if job is not None), len(list(sched.queues))

        await until(lambda: running_and_queued() == (1, 2), lambda: f"lanes and queue: {running_and_queued()}")
        snapshot = link.worker.snapshot()
        assert by_band(snapshot, "llamaswap_scheduler_queue_depth")["normal"] == 1
        jobs = {s.labels["class"]: s.value for f in snapshot_families(snapshot) for s in f.samples if s.name == "superfluid_queue_depth"}
        assert jobs["agent"] == 2
        assert (await pending).status == 200
