"""Through the whole middle layer (tests/edge/inproc.py): a model whose chat template is
Qwen3-Coder's (or GLM 4.6's) gets its calls, written in that template's ``<tool_call><function=...>``
format (GLM's ``<tool_call>name<arg_key>...``), back as ``tool_calls`` (streamed and not): the
worker tells the format from the template and says it in its Hello, the web side reads it from
there. Before, the template's ``<tool_call>`` had it taken for Hermes' JSON format, and the calls
came back as content with finish_reason ``stop``.
The agent's next turn (its calls and their results) is rendered by the same template."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.engines.chat import compile_chat_template, render_chat_template
from tests.api.streamed import said

from .inproc import JSON, MODEL, request
from .templated import edge_loop, engine_of
from .test_stream_equivalence import script

pytestmark = pytest.mark.django_db(transaction=True)

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather.", "parameters": PARAMS}}]
WRITTEN = (
    "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\n42\n</parameter>\n</function>\n</tool_call>"
)
# GLM 4.6's format, the same calls (its template's <tool_call> too was read as Hermes' JSON)
GLM_WRITTEN = (
    "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
    "<arg_value>3</arg_value>\n</tool_call>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>42</arg_value>\n</tool_call>"
)
CALLS = [("get_weather", '{"city": "Paris", "days": 3}'), ("get_weather", '{"city": "42"}')]
MODELS = {"qwen3-coder.jinja": WRITTEN, "glm-4.6.jinja": GLM_WRITTEN}
RENDERED: list[str] = []  # the prompts the engine's template wrote


@pytest.fixture(params=sorted(MODELS))
def edge(request: pytest.FixtureRequest) -> Iterator[tuple[asyncio.AbstractEventLoop, str]]:
    """The middle layer around a model with the template named by the parameter, and what that
    model writes for CALLS."""

    class Engine(engine_of(request.param)):  # type: ignore[misc,valid-type]
        def render_chat(self, messages: list[dict[str, Any]], **extra: Any) -> str:
            # the template itself, as the llama.cpp engine renders it
            text = render_chat_template(compile_chat_template(self.chat_template), messages, bos_token="", eos_token="", **extra)
            RENDERED.append(text)
            return text

    for loop in edge_loop(Engine, lane_ctx=4096):
        yield loop, MODELS[request.param]


def _ask(loop: asyncio.AbstractEventLoop, messages: list[dict[str, Any]], *, stream: bool) -> dict[str, Any]:
    """The reply to a chat offering TOOLS, as the client has it (a stream's deltas put together)."""
    body = {"model": MODEL, "messages": messages, "tools": TOOLS, "stream": stream}
    reply = loop.run_until_complete(request("POST", "/v1/chat/completions", json.dumps(body).encode(), JSON))
    view = said(reply, stream)
    return {"content": view["content"], "calls": view["calls"], "finish_reason": view["finish_reason"]}


@pytest.mark.parametrize("stream", [False, True])
def test_a_models_calls_in_its_own_tags_are_tool_calls(edge: tuple[asyncio.AbstractEventLoop, str], stream: bool) -> None:
    loop, written = edge
    got = _ask(loop, [{"role": "user", "content": "Weather in Paris? " + script(written)}], stream=stream)
    assert got == {"content": "Let me check.", "calls": CALLS, "finish_reason": "tool_calls"}
    # a reply in text stays text
    text = _ask(loop, [{"role": "user", "content": "Hi. " + script("Hello! <function= is a tag.")}], stream=stream)
    assert text == {"content": "Hello! <function= is a tag.", "calls": [], "finish_reason": "stop"}


def test_the_agents_next_turn_renders_its_calls_and_results(edge: tuple[asyncio.AbstractEventLoop, str]) -> None:
    """The calls sent back (arguments as JSON strings) and the tools' results: the template reads
    the arguments as a mapping; the request is answered, not refused."""
    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(CALLS)]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_1", "content": "no such city"},
        {"role": "user", "content": "And so? " + script("It is sunny in Paris.")},
    ]
    RENDERED.clear()
    got = _ask(edge[0], messages, stream=False)
    assert got == {"content": "It is sunny in Paris.", "calls": [], "finish_reason": "stop"}
    # the calls as the model writes them, by its own template, and the results after them
    prompt = next(t for t in RENDERED if "@@" not in t)  # (not those marking the client's strings: chat.split_rendered)
    if edge[1] is WRITTEN:
        assert "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>" in prompt
        assert "<parameter=city>\n42\n</parameter>" in prompt
    else:
        assert "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>" in prompt
        assert "<arg_value>42</arg_value>" in prompt
    assert prompt.index("sunny") > prompt.index("Paris") and "no such city" in prompt
