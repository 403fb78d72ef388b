"""Hostile bodies and headers against the in-process API (tests/edge/inproc.py): never a 5xx,
every error under the API's paths an OpenAI error object, every success a valid reply, and
the next normal request still served. bench/fuzz.py fires the same strategies at a live server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from .inproc import JSON, SimWorker, attached_loop, chat_body, request
from .strategies import GENERATION, NATIVE, Hostile, hostile_requests

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def edge(sim: SimWorker) -> Iterator[asyncio.AbstractEventLoop]:
    with attached_loop(sim) as loop:
        yield loop


def check_reply(case: Hostile, status: int, headers: dict[str, str], body: bytes) -> None:
    # (the simulated model has no fill-in-the-middle tokens: a body /infill parses is its 501)
    unsupported = case.path == "/infill" and status == 501 and json.loads(body)["error"]["code"] == "fim_unsupported"
    assert status < 500 or unsupported, (status, body[:300])
    api = case.path.startswith("/v1") or case.path in ("/health", "/slots", "/metrics", *NATIVE)
    if status >= 400 and api:
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)
    elif case.path in GENERATION and status == 200:
        if headers.get("content-type", "").startswith("text/event-stream"):
            frames = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
            assert frames[-1] == "[DONE]"
            for frame in frames[:-1]:
                json.loads(frame)
        else:
            assert "choices" in json.loads(body)
    elif case.path in NATIVE and status == 200:  # llama-server's shapes: its stream has no [DONE]
        if headers.get("content-type", "").startswith("text/event-stream"):
            frames = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
            assert frames and all("content" in json.loads(f) or "error" in json.loads(f) for f in frames if f != "[DONE]"), body[:300]
        else:
            assert isinstance(json.loads(body), (dict, list))
    elif api and case.path != "/metrics" and status < 300:
        json.loads(body)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=hostile_requests())
def test_no_hostile_request_gets_a_5xx_or_a_non_json_error_or_hurts_the_next_one(edge: asyncio.AbstractEventLoop, case: Hostile) -> None:
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in case.headers.items()]
    host = case.headers.get("host", "127.0.0.1:8000").encode("latin-1")
    reply = edge.run_until_complete(request(case.method, case.path, case.body, headers, host=host, timeout_s=20))
    check_reply(case, reply.status, reply.headers, reply.body)
    after = edge.run_until_complete(request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON, timeout_s=20))
    assert after.status == 200, after.body
