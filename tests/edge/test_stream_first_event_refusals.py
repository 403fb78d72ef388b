"""A completion-class stream waits for its job's first event before it answers, so that a job
that never starts is a real HTTP error, not an error frame in a 200. That first event may be a
``Rejected`` as well as an ``Error``: after its worker was lost the job is submitted again, the
new worker's ``Accepted`` is not passed on (the job was accepted), and the new worker may refuse
it (a smaller context, a different model, one shutting down). Driven through the in-process
middle layer; the refusal is put in place of the job's first output, as the link would deliver it.

While a stream of several jobs waits for each one's start, the jobs that started generate tokens
that nobody reads yet: when the request then fails or its client leaves, they still count in its
row (the key's usage)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from channels.testing import ApplicationCommunicator

from activity import writer as activity_writer
from activity.models import ActivityEntry
from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock
from scheduler.link import messages as m
from scheduler.worker.loop import EngineWorker
from tests.api.test_infill import FimSimWorker
from tests.edge.inproc import JSON, MODEL, SimWorker, application, attached, request, scope

pytestmark = pytest.mark.django_db(transaction=True)

COMPLETION = [*JSON, (b"x-superfluid-qos", b"completion")]


def refused(job_id: str) -> m.Message:
    # what a new worker with a smaller context answers a resubmitted job
    return m.Rejected(job_id, m.CONTEXT_LENGTH_EXCEEDED, "This model's maximum context length is 64 tokens.", param="prompt")


def missed(job_id: str) -> m.Message:
    return m.Error(job_id, m.DEADLINE_EXCEEDED, "The completion was not started before its deadline.")


def first_output_replaced(link: Any, make: Callable[[str], m.Message], *, jobs: set[int]) -> None:
    """The first output (a Delta or a Done) of the jobs accepted ``jobs``-th (0 first) becomes
    ``make(job id)``; the link drops what the worker sends for that job afterwards."""
    deliver = link._on_message
    accepted: list[str] = []
    replaced: set[str] = set()

    def on_message(message: m.Message) -> None:
        job = getattr(message, "id", "")
        if isinstance(message, m.Accepted) and job not in accepted:
            accepted.append(job)
        elif isinstance(message, (m.Delta, m.Done)) and job in accepted and accepted.index(job) in jobs and job not in replaced:
            replaced.add(job)
            message = make(job)
        deliver(message)

    link._on_message = on_message


def completion_body(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 4, "stream": True, **fields}).encode()


@pytest.mark.parametrize("make", [refused, missed], ids=["rejected", "error"])
async def test_a_completion_stream_whose_job_is_refused_first_is_an_http_error(make: Callable[[str], m.Message]) -> None:
    async with attached(SimWorker()) as (link, _rt):
        first_output_replaced(link, make, jobs={0})
        reply = await request("POST", "/v1/completions", completion_body(), COMPLETION)
    expected = 400 if make is refused else 503
    assert reply.status == expected and reply.is_error_object(), (reply.status, reply.body)
    assert reply.json()["error"]["code"] == make("j").reason  # type: ignore[attr-defined]


@pytest.mark.parametrize("make", [refused, missed], ids=["rejected", "error"])
async def test_a_completion_stream_of_several_choices_one_refused_first_is_an_http_error(make: Callable[[str], m.Message]) -> None:
    async with attached(SimWorker()) as (link, _rt):
        first_output_replaced(link, make, jobs={1})
        reply = await request("POST", "/v1/completions", completion_body(n=2), COMPLETION)
    expected = 400 if make is refused else 503
    assert reply.status == expected and reply.is_error_object(), (reply.status, reply.body)
    assert reply.json()["error"]["code"] == make("j").reason  # type: ignore[attr-defined]


async def test_an_infill_stream_whose_job_is_refused_first_is_an_http_error() -> None:
    body = json.dumps({"input_prefix": "def f(", "input_suffix": "):\n", "n_predict": 4, "stream": True}).encode()
    async with attached(FimSimWorker()) as (link, _rt):
        reply = await request("POST", "/infill", body, JSON)
        assert reply.status == 200 and reply.sse_data(), reply.body  # served as it is
        first_output_replaced(link, refused, jobs={0})  # the next request's job
        reply = await request("POST", "/infill", body, JSON)
    assert reply.status == 400 and reply.is_error_object(), (reply.status, reply.body)


class OneLaneWithDeadline(SimWorker):
    """One lane, and a completion that has not started within 300 ms (of simulated time, which
    each decode step advances by 60 ms) ends with ``completion_deadline_exceeded``. Each step
    also takes 20 ms of real time, so that a request's second job reaches the worker before its
    first has run for 300 ms."""

    deadline_ms = 300

    def __init__(self) -> None:
        super().__init__(lanes=1, step_sleep_s=0.02)

    def make_worker(self) -> EngineWorker:
        clock = FakeClock()
        engine = self.engine_class(n_lanes=1, lane_ctx=self.lane_ctx, clock=clock)
        engine.on_call = lambda _n: time.sleep(self.step_sleep_s)
        config = SchedulerConfig(max_batch=1, lane_ctx=self.lane_ctx)
        return EngineWorker(engine, config, model_name=MODEL, clock=clock, prepare_in_thread=True, completion_deadline_ms=self.deadline_ms)


async def test_tokens_a_choice_generated_before_a_sibling_missed_its_start_count_in_the_row() -> None:
    """A streamed completion-class request of two prompts on one lane: the first prompt's job
    runs while the second waits, and the second misses its start deadline. The request is a 503
    (nothing was streamed yet: its stream waits for every job's start), but the tokens the first
    job generated until then (one each 60 ms: at least 5 in the 300 ms) were generated for it,
    and its row (the key's usage) counts them. It counted none: they were never read."""
    async with attached(OneLaneWithDeadline()):
        reply = await request("POST", "/v1/completions", completion_body(prompt=["Hello", "World"], max_tokens=20), COMPLETION)
        assert reply.status == 503 and reply.json()["error"]["code"] == m.DEADLINE_EXCEEDED, (reply.status, reply.body)
        assert await asyncio.to_thread(activity_writer.flush)
        rows = [row async for row in ActivityEntry.objects.values("status", "completion_tokens")]
    assert len(rows) == 1 and rows[0]["status"] == 503, rows
    assert rows[0]["completion_tokens"] is not None and 5 <= rows[0]["completion_tokens"] <= 20, rows


async def test_tokens_a_choice_generated_before_its_client_left_waiting_for_a_sibling_count_in_the_row() -> None:
    """The same request, no deadline: its client gives up while the second prompt's job waits
    for the lane (nothing was streamed yet). The tokens the first job generated count in its row."""
    worker = OneLaneWithDeadline()
    worker.deadline_ms = 0
    body = completion_body(prompt=["Hello", "World"], max_tokens=20)
    async with attached(worker) as (link, _rt):
        comm = ApplicationCommunicator(application(), scope("POST", "/v1/completions", COMPLETION))
        await comm.send_input({"type": "http.request", "body": body, "more_body": False})
        for _ in range(500):  # until the first job has generated 5 tokens
            if any(handle.delivered_tokens >= 5 for handle in link.inflight.values()):
                break
            await asyncio.sleep(0.01)
        await comm.send_input({"type": "http.disconnect"})
        await comm.wait(10)
        assert await asyncio.to_thread(activity_writer.flush)
        rows = [row async for row in ActivityEntry.objects.values("status", "completion_tokens")]
    assert len(rows) == 1 and rows[0]["status"] == 499, rows
    assert rows[0]["completion_tokens"] is not None and rows[0]["completion_tokens"] >= 5, rows
