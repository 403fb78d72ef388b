"""A streamed ``POST /v1/responses`` whose input the context cannot hold (api/responses_api.py
``ResponsesConsumer.send_failed_stream``): a 200 event stream ending in ``response.failed`` with
``error.code`` ``context_length_exceeded``, as OpenAI reports it, which is where the Codex CLI
reads it (codex-api ``sse/responses.rs``: ``ApiError::ContextWindowExceeded``, its context
window full); an HTTP 400 Codex shows as an invalid request. Unstreamed, it stays the 400 every
other client expects; other refusals before the stream stay HTTP errors. Through the unmodified
``openai`` client and raw ASGI, in-process, around a lane of 2,048 tokens."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from activity import writer as activity_writer
from activity.models import ActivityEntry
from api.errors import ApiError
from api.metrics import web_metrics
from api.responses_api import ResponseEvents
from api.schemas import GenerationRequest
from tests.api.test_responses_api import QwenEngine, raw_stream, run, streamed
from tests.edge.inproc import JSON, MODEL, request
from tests.edge.templated import edge_loop

pytestmark = pytest.mark.django_db(transaction=True)

# over a lane of 2,048 tokens: at the worker's count (15,000 characters are ~3,000 tokens), at the
# web side's size check before any tokenising (more than 64 characters a token), and a prompt
# that fits but leaves no room for max_output_tokens (the worker's count again)
OVER: dict[str, dict[str, Any]] = {
    "worker": {"input": "word " * 3000},
    "size check": {"input": "x" * (2048 * 64 + 1)},
    "with max_output_tokens": {"input": "hi", "max_output_tokens": 5000},
}
SAID = {"worker": "However, you requested", "size check": "characters, more than can fit", "with max_output_tokens": "in the completion"}


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    yield from edge_loop(QwenEngine, lane_ctx=2048)


def post(loop: asyncio.AbstractEventLoop, body: dict[str, Any]) -> Any:
    return loop.run_until_complete(request("POST", "/v1/responses", json.dumps({"model": MODEL, **body}).encode(), JSON))


def rows() -> list[tuple[Any, ...]]:
    assert activity_writer.flush()
    return list(ActivityEntry.objects.order_by("id").values_list("endpoint", "status", "error_code", "stream", "request_id"))


@pytest.mark.parametrize("where", OVER)
def test_a_streamed_input_over_the_context_is_a_stream_ending_in_response_failed(loop: asyncio.AbstractEventLoop, where: str) -> None:
    web_metrics.reset()
    reply = post(loop, {"stream": True, **OVER[where]})
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/event-stream"), reply.body[:300]
    wire = raw_stream(loop, **OVER[where])
    assert [name for name, _ in wire] == ["response.created", "response.in_progress", "error", "response.failed"]
    assert all(name == data["type"] for name, data in wire)
    assert [data["sequence_number"] for _, data in wire] == [0, 1, 2, 3]
    assert len({data["response"]["id"] for _, data in wire if "response" in data}) == 1
    assert wire[0][1]["response"]["id"].startswith("resp_") and wire[0][1]["response"]["status"] == "in_progress"
    error = wire[2][1]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "input") and SAID[where] in error["message"]
    failed = wire[3][1]["response"]
    assert failed["status"] == "failed" and failed["output"] == [] and failed["incomplete_details"] is None
    assert failed["error"] == {"code": "context_length_exceeded", "message": error["message"]}
    # the activity row and the metrics count the refusal as the unstreamed one's: 400, its code
    got = rows()
    assert [row[:4] for row in got] == [("chat", 400, "context_length_exceeded", True)] * 2
    assert got[0][4] == reply.headers["x-request-id"]
    assert web_metrics.key_rejections == {("anonymous", "context_length_exceeded"): 2}
    assert web_metrics.requests == {("chat", "400"): 2}


def test_the_openai_client_reads_the_failed_response_from_the_stream(loop: asyncio.AbstractEventLoop) -> None:
    events, final = streamed(loop, input="word " * 3000)
    assert final is None and [e.type for e in events] == ["response.created", "response.in_progress", "error", "response.failed"]
    assert events[-1].response.status == "failed" and events[-1].response.error.code == "context_length_exceeded"
    assert events[2].code == "context_length_exceeded"

    async def create(client: Any) -> list[Any]:
        return [event async for event in await client.responses.create(model=MODEL, input="x" * (2048 * 64 + 1), stream=True)]

    assert [e.type for e in run(loop, create)][-1] == "response.failed"


@pytest.mark.parametrize("where", OVER)
def test_unstreamed_an_input_over_the_context_stays_a_400(loop: asyncio.AbstractEventLoop, where: str) -> None:
    reply = post(loop, OVER[where])
    assert reply.status == 400 and reply.is_error_object() and reply.headers["x-request-id"]
    assert (reply.json()["error"]["code"], reply.json()["error"]["param"]) == ("context_length_exceeded", "input")


@pytest.mark.parametrize(
    "body",
    [
        {"input": 5},  # a bad body
        {"input": "x" * (2048 * 64 + 1), "previous_response_id": "resp_1"},  # over the context too, but refused first
        {"input": "hi", "max_output_tokens": -1},  # refused by the chat parser
    ],
)
def test_other_refusals_of_a_streamed_request_stay_http_errors(loop: asyncio.AbstractEventLoop, body: dict[str, Any]) -> None:
    reply = post(loop, {"stream": True, **body})
    assert reply.status == 400 and reply.is_error_object() and reply.headers["content-type"].startswith("application/json")
    assert reply.json()["error"]["code"] != "context_length_exceeded"


@given(message=st.text(max_size=200), param=st.one_of(st.none(), st.text(max_size=20)))
def test_a_failure_before_any_output_is_the_opening_then_error_and_response_failed(message: str, param: str | None) -> None:
    """Whatever the error says, the events count from 0 in one Response, which fails with no output."""
    events = ResponseEvents("resp_x", 1, MODEL, {}, GenerationRequest(endpoint="chat", model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True))
    frames = [*events.opening, *events.failed(ApiError(400, message, param=param, code="context_length_exceeded"))]
    assert [f["type"] for f in frames] == ["response.created", "response.in_progress", "error", "response.failed"]
    assert [f["sequence_number"] for f in frames] == [0, 1, 2, 3]
    assert frames[-1]["response"]["error"] == {"code": "context_length_exceeded", "message": message}
    assert frames[-1]["response"]["output"] == [] and events.ended
