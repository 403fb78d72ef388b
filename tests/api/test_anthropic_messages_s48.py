"""Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``; api/anthropic.py)
driven by the unmodified ``anthropic`` SDK through the in-process middle layer
(tests/edge/inproc.py: the real ASGI application, the worker around a scripted engine whose
chat template is a real model's), over an httpx transport into the application.

The model writes what its prompt's script says (tests/edge/test_stream_equivalence.script):
text, a Hermes ``<tool_call>`` (Qwen 2.5's template) or ``<think>`` reasoning (Qwen 3's)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from django.test import override_settings

from keys.credentials import digest_of
from keys.runtime import Key, Policy
from tests.edge.inproc import CLIENT, JSON, MODEL, SimWorker, application, attached, request
from tests.edge.templated import edge_loop, engine_of
from tests.edge.test_stream_equivalence import script

pytestmark = pytest.mark.django_db(transaction=True)

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def client(**options: Any) -> anthropic.AsyncAnthropic:
    """The SDK, its HTTP going into the ASGI application (no server, no network)."""
    transport = httpx.ASGITransport(app=application(), client=CLIENT)
    http = httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000")
    options.setdefault("api_key", "sk-anything")
    return anthropic.AsyncAnthropic(base_url="http://127.0.0.1:8000", max_retries=0, http_client=http, **options)


@pytest.fixture
def qwen() -> Iterator[asyncio.AbstractEventLoop]:
    """A model with Qwen 2.5's template: Hermes tool calls, no reasoning."""
    yield from edge_loop(engine_of("qwen2.5-7b-instruct.jinja"), lane_ctx=4096)


@pytest.fixture
def thinker() -> Iterator[asyncio.AbstractEventLoop]:
    """A model with Qwen 3's template: <think> reasoning, Hermes tool calls."""
    yield from edge_loop(engine_of("Qwen-Qwen3-0.6B.jinja"), lane_ctx=4096)


def run(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    return loop.run_until_complete(coro)


async def create(**kwargs: Any) -> Any:
    kwargs.setdefault("model", MODEL)
    kwargs.setdefault("max_tokens", 256)
    async with client() as sdk:
        return await sdk.messages.create(**kwargs)


async def streamed(**kwargs: Any) -> tuple[Any, list[Any]]:
    """(the SDK's final message of a stream, the stream's events)."""
    kwargs.setdefault("model", MODEL)
    kwargs.setdefault("max_tokens", 256)
    events = []
    async with client() as sdk, sdk.messages.stream(**kwargs) as stream:
        async for event in stream:
            events.append(event)
        return await stream.get_final_message(), events


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


# -- text ---------------------------------------------------------------------------------------


def test_a_text_reply_is_a_message(qwen: asyncio.AbstractEventLoop) -> None:
    message = run(qwen, create(messages=user("Hi " + script("Hello there!"))))
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.id.startswith("msg_")
    assert [(b.type, b.text) for b in message.content] == [("text", "Hello there!")]
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert message.usage.output_tokens == len("Hello there!")  # (one byte a token)
    assert message.usage.input_tokens > 0


def test_a_streamed_reply_is_the_same_message(qwen: asyncio.AbstractEventLoop) -> None:
    plain = run(qwen, create(messages=user("Hi " + script("Hello there!"))))
    final, events = run(qwen, streamed(messages=user("Hi " + script("Hello there!"))))
    assert [(b.type, b.text) for b in final.content] == [("text", "Hello there!")]
    assert (final.stop_reason, final.stop_sequence) == ("end_turn", None)
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert final.usage.input_tokens == plain.usage.input_tokens
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
