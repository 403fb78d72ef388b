"""Through the whole middle layer (tests/edge/inproc.py): a model whose chat template teaches
Mistral's or Llama 3.1's own tool-call format gets its calls back as ``tool_calls``, streamed and
not. The worker tells the format from the template and says it in its Hello; the web side reads
it from there; the control token ``[TOOL_CALLS]`` (no text when decoded as plain text) is written
into the reply's text by the worker. Before, both replies came back as content."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from scheduler.engines.base import Step
from tests.api.streamed import assemble

from .inproc import JSON, MODEL, request
from .templated import TemplateEngine, engine_of, loop_fixture
from .test_stream_equivalence import script

pytestmark = pytest.mark.django_db(transaction=True)

TOOL_CALLS = 300  # Mistral's control token, as the scripted model samples it (byte 1 in a script)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


class NativeEngine(TemplateEngine):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.vocab_size = TOOL_CALLS + 1

    def tokenize(self, text: str, *, add_special: bool = True, special: bool = True, after: int | None = None) -> list[int]:
        if special and text == "[TOOL_CALLS]":
            return [TOOL_CALLS]
        return super().tokenize(text, add_special=add_special, special=special, after=after)

    def token_bytes(self, token: int) -> bytes:
        return b"" if token == TOOL_CALLS else super().token_bytes(token)

    def forward(self, step: Step) -> dict[int, int]:
        return {lane: TOOL_CALLS if token == 1 else token for lane, token in super().forward(step).items()}


mistral = loop_fixture("mistral", engine_of("mistral-nemo-instruct-2407.jinja", NativeEngine))
llama = loop_fixture("llama", engine_of("llama-3.1-instruct.jinja", NativeEngine))


def _ask(loop: asyncio.AbstractEventLoop, written: str, *, stream: bool) -> dict[str, Any]:
    """The reply to a chat offering TOOLS whose model writes ``written``, as the client has it
    (a stream's deltas put together)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris? " + script(written)}], "tools": TOOLS, "stream": stream}
    reply = loop.run_until_complete(request("POST", "/v1/chat/completions", json.dumps(body).encode(), JSON))
    assert reply.status == 200, reply.body
    if not stream:
        choice = reply.json()["choices"][0]
        calls = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls") or []]
        return {"content": choice["message"]["content"], "calls": calls, "finish_reason": choice["finish_reason"]}
    got = assemble([json.loads(data) for data in reply.sse_data() if data != "[DONE]"])
    return {"content": got.content or None, "calls": [(c["id"], c["name"], c["arguments"]) for c in got.calls], "finish_reason": got.finish_reason}


@pytest.mark.parametrize("stream", [False, True])
def test_a_mistral_models_calls_are_tool_calls(mistral: asyncio.AbstractEventLoop, stream: bool) -> None:
    got = _ask(mistral, 'Let me look.\x01[{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"}]', stream=stream)
    assert got == {"content": "Let me look.", "calls": [("abcDEF123", "get_weather", '{"city": "Paris"}')], "finish_reason": "tool_calls"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_llama31_models_calls_are_tool_calls(llama: asyncio.AbstractEventLoop, stream: bool) -> None:
    got = _ask(llama, '{"name": "get_weather", "parameters": {"city": "Paris"}}', stream=stream)
    assert got["content"] is None and got["finish_reason"] == "tool_calls"
    assert [(name, args) for _id, name, args in got["calls"]] == [("get_weather", '{"city": "Paris"}')]
    # a reply in text stays text
    text = _ask(llama, "It is sunny.", stream=stream)
    assert text == {"content": "It is sunny.", "calls": [], "finish_reason": "stop"}
