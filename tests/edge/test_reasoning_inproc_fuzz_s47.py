"""Fuzz through the whole middle layer (tests/edge/inproc.py), on the real templates of the
reasoning models whose replies this server splits (gpt-oss's harmony, Qwen 3's ``<think>``, GLM
4.6's and 4.7's, Qwen 3.5's with its own tool-call tags): a hostile history (an earlier reply sent
back with any ``reasoning_content``/``thinking`` and calls) and a hostile reply (the markers of
every format, in any order, written byte by byte) never give a 5xx or an error that is not an
OpenAI error object, and the streamed reply says what the unstreamed one says."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.test_reasoning_tools_fuzz_s47 import FRAGMENTS

from .inproc import JSON, MODEL, SimWorker, attached, request
from .strategies import earlier_reply
from .test_stream_equivalence import ScriptEngine, script

pytestmark = pytest.mark.django_db(transaction=True)

TEMPLATES = Path(__file__).parent.parent / "api" / "templates_s46"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}},
]
# text a client may send back that passes the schema (a lone surrogate is a 400 there): control
# tokens' and markers' text among it
texts = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12),
    st.lists(st.sampled_from([*FRAGMENTS, "<|im_end|>", "<|im_start|>", "<|return|>", "<|call|>", "[gMASK]", "<|user|>", "<|assistant|>", "<|observation|>"]), max_size=5).map("".join),
)
valid_reply = st.fixed_dictionaries(
    {"role": st.just("assistant"), "content": st.one_of(st.none(), texts)},
    optional={
        "reasoning_content": texts,
        "thinking": texts,
        "tool_calls": st.lists(
            st.fixed_dictionaries({"id": st.text(alphabet="abc_123", min_size=1, max_size=9), "type": st.just("function"), "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "get_weather"]), "arguments": st.dictionaries(st.sampled_from(["city", "days", "<x>"]), texts, max_size=2).map(json.dumps)})}),
            max_size=2,
        ),
    },
)
MODELS = ["gpt-oss-120b.jinja", "Qwen-Qwen3-0.6B.jinja", "glm-4.6.jinja", "glm-4.7-flash.jinja", "qwen3.5-4b.jinja"]


@pytest.fixture(params=MODELS)
def edge(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    class Engine(ScriptEngine):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.features = self.features | {"template_vars"}
            self.chat_template = (TEMPLATES / request.param).read_text()

    class Worker(SimWorker):
        engine_class = Engine

    loop = asyncio.new_event_loop()
    context = attached(Worker(lanes=2, lane_ctx=4096))
    with override_settings(SUPERFLUID_COMPLETION_RATE="0"):
        loop.run_until_complete(context.__aenter__())
        yield loop
        loop.run_until_complete(context.__aexit__(None, None, None))
    loop.close()


def _said(reply: Any, stream: bool) -> Any:
    """What a reply tells its client: its status and error, or its message put together."""
    if reply.status != 200:
        assert reply.status < 500 and reply.is_error_object(), (reply.status, reply.body[:300])
        return reply.status, reply.json()["error"]["code"]
    if not stream:
        choice = reply.json()["choices"][0]
        message = choice["message"]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
        return message.get("reasoning_content"), message["content"] or None, calls, choice["finish_reason"]
    reasoning, content, calls, finish = None, None, {}, None
    frames = reply.sse_data()
    assert frames[-1] == "[DONE]", frames[-3:]
    for data in frames[:-1]:
        frame = json.loads(data)
        assert "error" not in frame, frame
        for choice in frame["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning_content") is not None:
                reasoning = (reasoning or "") + delta["reasoning_content"]
            if delta.get("content") is not None:
                content = (content or "") + delta["content"]
            for c in delta.get("tool_calls") or []:
                entry = calls.setdefault(c["index"], ["", ""])
                entry[0] += c.get("function", {}).get("name") or ""
                entry[1] += c.get("function", {}).get("arguments") or ""
            finish = choice["finish_reason"] or finish
    return reasoning, content or None, [tuple(calls[i]) for i in sorted(calls)], finish


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    written=st.lists(st.sampled_from(FRAGMENTS), max_size=16).map("".join),
    history=st.lists(st.one_of(valid_reply, valid_reply, earlier_reply), max_size=2),
    result=texts,
    tools=st.booleans(),
    max_tokens=st.sampled_from([None, 5, 40]),
    reasoning_format=st.sampled_from([None, "auto", "none"]),
)
def test_hostile_history_and_replies_stream_what_the_whole_reply_says(
    edge: asyncio.AbstractEventLoop, written: str, history: list[dict[str, Any]], result: str, tools: bool, max_tokens: int | None, reasoning_format: str | None
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    for turn in history:
        messages.append(turn)
        for call in turn.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    marker = script(written)
    messages.append({"role": "user", "content": "go " + marker})
    body: dict[str, Any] = {"model": MODEL, "messages": messages}
    for key, value in (("tools", TOOLS if tools else None), ("max_tokens", max_tokens), ("reasoning_format", reasoning_format)):
        if value is not None:
            body[key] = value
    said = []
    for stream in (False, True):
        reply = edge.run_until_complete(request("POST", "/v1/chat/completions", json.dumps({**body, "stream": stream}).encode(), JSON, timeout_s=20))
        said.append(_said(reply, stream))
    assert said[0] == said[1], (written, said)
    after = edge.run_until_complete(request("POST", "/v1/chat/completions", json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode(), JSON, timeout_s=20))
    assert after.status == 200, after.body
