"""--stream-interval-ms through the whole web side: a stream's tokens arrive in fewer SSE events,
several tokens each, and the client puts together the same reply (the stream-equivalence fuzz,
tests/edge/test_stream_equivalence.py, runs with and without the interval). In-process: the real
ASGI application and worker code around the simulated engine, whose rounds take 60 ms on its
fake clock."""

from __future__ import annotations

import asyncio
import json

import pytest

from .inproc import JSON, MODEL, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)


async def streamed_chat(interval_ms: int, max_tokens: int) -> tuple[list[str], str, int]:
    """(each content delta, the unstreamed reply's content, its completion tokens)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens, "temperature": 0}
    async with attached(SimWorker(stream_interval_ms=interval_ms)):
        plain = (await request("POST", "/v1/chat/completions", json.dumps(body).encode(), JSON)).json()
        reply = await request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}).encode(), JSON)
    pieces = []
    for data in reply.sse_data():
        if data != "[DONE]":
            pieces += [c["delta"]["content"] for c in json.loads(data)["choices"] if c["delta"].get("content")]
    return pieces, plain["choices"][0]["message"]["content"], plain["usage"]["completion_tokens"]


def test_with_the_interval_a_stream_carries_several_tokens_an_event_and_the_same_text() -> None:
    every, text, tokens = asyncio.run(streamed_chat(0, 24))
    paced, paced_text, paced_tokens = asyncio.run(streamed_chat(200, 24))
    assert tokens == paced_tokens == 24 and text == paced_text
    assert "".join(every) == "".join(paced) == text
    assert len(every) == 24  # a token an event
    # 200 ms of 60 ms rounds: the first token alone, then four rounds' tokens an event
    assert len(paced) <= 1 + 24 // 3 and len(paced[0]) == 1
