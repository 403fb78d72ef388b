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
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.streamed import said
from tests.api.test_reasoning_tools_fuzz_s47 import FRAGMENTS

from .inproc import JSON, MODEL, request
from .strategies import earlier_reply
from .templated import edge_loop, engine_of
from .test_stream_equivalence import script

pytestmark = pytest.mark.django_db(transaction=True)

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
    yield from edge_loop(engine_of(request.param), lane_ctx=4096)


def _said(reply: Any, stream: bool) -> Any:
    """What a reply tells its client: its status and error, or its message put together."""
    if reply.status != 200:
        assert reply.status < 500 and reply.is_error_object(), (reply.status, reply.body[:300])
        return reply.status, reply.json()["error"]["code"]
    view = said(reply, stream)
    return view["reasoning"], view["content"], view["calls"], view["finish_reason"]


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
