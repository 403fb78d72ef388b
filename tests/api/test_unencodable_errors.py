"""What the client is told when the link cannot carry a job's message (``unencodable``). A lone
surrogate never reaches the link (api/schemas.py refuses it with a 400 naming its parameter), so
the reason meant one of two other things, both once answered as a 400 "the request contains a
lone surrogate": the worker could not encode the job's output (a NaN logprob from the model: the
server's failure, a 500 the client may retry), or the request was nested too deeply for the
link's encoder (the request's own, a 400 that says so)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.link_errors import link_error
from scheduler.engines.sim import SimEngine
from scheduler.link import messages as m
from tests.edge.inproc import JSON, SimWorker, attached, chat_body, request

pytestmark = pytest.mark.django_db(transaction=True)


class NanLogprobSim(SimEngine):
    """A model whose logits overflowed: every logprob it reports is NaN, which JSON cannot carry."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.features = frozenset({"logprobs"})

    def take_logprobs(self) -> dict[int, tuple[float, list[tuple[int, float]]]]:
        return {lane: (float("nan"), []) for lane in self.bound_lanes()}


class NanLogprobWorker(SimWorker):
    engine_class = NanLogprobSim


async def test_output_the_worker_cannot_encode_is_a_server_error_not_a_bad_request() -> None:
    async with attached(NanLogprobWorker()):
        reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=5, logprobs=True), JSON)
    assert reply.is_error_object()
    error = reply.json()["error"]
    assert reply.status == 500 and error["type"] == "server_error", reply.body
    assert "surrogate" not in error["message"]


async def test_output_the_worker_cannot_encode_mid_stream_is_a_server_error_frame() -> None:
    async with attached(NanLogprobWorker()):
        reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=5, logprobs=True, stream=True), JSON)
    assert reply.status == 200
    data = reply.sse_data()
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert error["type"] == "server_error" and "surrogate" not in error["message"], data


async def test_a_request_nested_too_deeply_for_the_link_is_a_400_that_does_not_blame_a_surrogate() -> None:
    # 980 levels parse (json.loads' limit is near the recursion limit, 1,000) but are too deep
    # for the link's encoder, further down the stack
    nested = b"[" * 980 + b"]" * 980
    body = chat_body(max_tokens=2, chat_template_kwargs={"a": 0}).replace(b'{"a": 0}', b'{"a": ' + nested + b"}")
    async with attached(SimWorker()):
        reply = await request("POST", "/v1/chat/completions", body, JSON)
    assert reply.status == 400 and reply.is_error_object(), reply.body
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and "surrogate" not in error["message"], error


@pytest.mark.parametrize(
    ("event", "status", "kind"),
    [
        (m.Rejected("j", m.UNENCODABLE, "Submit message cannot be encoded: maximum recursion depth exceeded"), 400, "invalid_request_error"),
        (m.Error("j", m.UNENCODABLE, "The response could not be encoded."), 500, "server_error"),
    ],
)
def test_unencodable_is_the_requests_fault_only_when_the_request_could_not_be_sent(event: Any, status: int, kind: str) -> None:
    error = link_error(event)
    assert (error.status, error.type) == (status, kind)
    assert "surrogate" not in error.message
