"""Magistral's and Ministral 3 Reasoning's replies: ``[THINK]...[/THINK]`` then the answer, as
llama-server's ministral_3 handler splits them (common/parsers/ministral3.cpp: its reasoning
in ``reasoning_content``, ``[THINK]`` and ``[/THINK]`` among its preserved tokens). The template
was read as no reasoning format and the worker printed those control tokens as nothing, so the
client got the model's thoughts run into its answer in ``content`` ("The user greets me.Hello!")."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.responses import Reply
from scheduler.engines import chat as chat_format
from scheduler.link.messages import Delta, Done
from tests.api.streamed import streamed_chunks
from tests.api.test_tool_native_formats_s46 import _worker

from .templated import TemplateEngine
from .test_reasoning_inproc_s47 import _ask, _edge

pytestmark = pytest.mark.django_db(transaction=True)

TEMPLATES = Path(__file__).parent.parent / "api" / "templates_s46"
MINISTRAL = (TEMPLATES / "ministral-3-14b-reasoning-2512.jinja").read_text()
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


class MinistralEngine(TemplateEngine):
    template = MINISTRAL


@pytest.fixture
def ministral() -> Iterator[asyncio.AbstractEventLoop]:
    yield from _edge(MinistralEngine)


def test_the_format_is_read_from_the_template_and_the_worker_writes_its_markers() -> None:
    assert chat_format.reasoning_format(MINISTRAL) == "mistral"
    assert chat_format.reasoning_format((TEMPLATES / "mistral-small-3.2-24b-instruct-2506.jinja").read_text()) == "none"
    worker = _worker(MINISTRAL, {"[THINK]": 1000, "[/THINK]": 1001, "[TOOL_CALLS]": 1002, "[ARGS]": 1003})
    assert worker.hello().reasoning_format == "mistral"
    spell = worker._reply_token_bytes(chat=True, offers_tools=False)
    assert (spell(1000), spell(1001), spell(1002), spell(ord("a"))) == (b"[THINK]", b"[/THINK]", b"", b"a")
    assert worker._reply_token_bytes(chat=True, offers_tools=True)(1002) == b"[TOOL_CALLS]"
    assert worker._reply_token_bytes(chat=False, offers_tools=False)(1000) == b""  # /v1/completions: as before


@pytest.mark.parametrize("stream", [False, True])
def test_the_reasoning_is_reasoning_content(ministral: asyncio.AbstractEventLoop, stream: bool) -> None:
    got = _ask(ministral, "[THINK]The user wants the weather.[/THINK]It is sunny in Paris.", stream=stream)
    assert got == {"reasoning": "The user wants the weather.", "content": "It is sunny in Paris.", "calls": [], "finish_reason": "stop"}
    plain = _ask(ministral, "It is sunny.", stream=stream)  # a reply that opens no block: all answer
    assert plain == {"reasoning": None, "content": "It is sunny.", "calls": [], "finish_reason": "stop"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_after_the_reasoning_is_a_tool_call(ministral: asyncio.AbstractEventLoop, stream: bool) -> None:
    got = _ask(ministral, '[THINK]Need the weather.[/THINK][TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', stream=stream, tools=TOOLS)
    assert got == {"reasoning": "Need the weather.", "content": None, "calls": [("get_weather", '{"city": "Paris"}')], "finish_reason": "tool_calls"}


def test_any_split_of_the_reply_streams_the_same() -> None:
    text = "[THINK]Some thoughts.[/THINK]  The answer."
    for size in range(1, 12):
        chunks = streamed_chunks(Reply("chat", "m", reasoning_format="mistral"), [text[i : i + size] for i in range(0, len(text), size)])
        reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks if c["choices"])
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert (reasoning, content) == ("Some thoughts.", "The answer."), size
    whole = Reply("chat", "m", reasoning_format="mistral")
    whole.add(Delta("j", text))
    message = whole.body(Done("j", "stop"), None)["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Some thoughts.", "The answer.")
