"""Hostile prefills through the whole middle layer (tests/edge/inproc.py), on real chat
templates: any text as the last assistant turn (control tokens' text, white space, nothing,
parts), after turns in any order (system late, tool results without calls, assistant turns in a
row, a turn of calls last), with thinking on or off, on every route that renders a prefill. No
5xx, every error a clean error object of its API naming what it refuses; a reply is the scripted
continuation alone, and where the turn was a prefill the engine's prompt ends with its text."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.api.streamed import said

from .inproc import JSON, MODEL, request
from .templated import TEMPLATES, edge_loop
from .test_assistant_prefill_inproc_s52 import PROMPTS, RecordingEngine
from .test_stream_equivalence import script

pytestmark = pytest.mark.django_db(transaction=True)

TEMPLATE_FILES = ["qwen2.5-7b-instruct.jinja", "Qwen-Qwen3-0.6B.jinja", "gemma-2-2b-it.jinja"]
ROUTES = ["/v1/chat/completions", "/apply-template", "/v1/chat/completions/input_tokens", "/v1/messages", "/v1/messages/count_tokens"]
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}

texts = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=16),
    st.lists(st.sampled_from(["<|im_end|>", "<|im_start|>", "<end_of_turn>", "<think>", "</think>", "<tool_call>", "{", " ", "\n", "[[S0]]", "é"]), max_size=5).map("".join),
)
turns = st.lists(st.sampled_from(["system", "user", "assistant", "calls", "tool"]), max_size=5)


@pytest.fixture(params=TEMPLATE_FILES)
def edge(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    engine = type("Engine", (RecordingEngine,), {"template": (TEMPLATES / request.param).read_text()})
    yield from edge_loop(engine, lane_ctx=4096)


def _history(roles: list[str], words: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for role, word in zip(roles, words, strict=False):
        if role == "calls":
            out.append({"role": "assistant", "content": word, "tool_calls": [CALL]})
        elif role == "tool":
            out.append({"role": "tool", "tool_call_id": "call_1", "content": word})
        else:
            out.append({"role": role, "content": word})
    return out


def _anthropic(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat's user and assistant turns as Messages turns (a turn of calls as tool_use)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            out.append({"role": "assistant", "content": [{"type": "text", "text": m["content"] or "x"}, {"type": "tool_use", "id": "call_1", "name": "f", "input": {}}]})
        elif m["role"] in ("user", "assistant"):
            out.append({"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else m["content"] or ""})
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    roles=turns,
    words=st.lists(texts, min_size=5, max_size=5),
    prefill=st.one_of(texts, st.none(), st.lists(texts, min_size=1, max_size=3)),
    last_calls=st.booleans(),
    thinking=st.sampled_from([None, True, False]),
    route=st.sampled_from(ROUTES),
    stream=st.booleans(),
)
def test_any_prefill_is_continued_or_cleanly_refused(
    edge: asyncio.AbstractEventLoop, roles: list[str], words: list[str], prefill: Any, last_calls: bool, thinking: bool | None, route: str, stream: bool
) -> None:
    marker = script("ok")
    content: Any = [{"type": "text", "text": t} for t in prefill] if isinstance(prefill, list) else prefill
    last: dict[str, Any] = {"role": "assistant", "content": content}
    if last_calls:
        last["tool_calls"] = [CALL]
    messages = [{"role": "user", "content": "Go " + marker}, *_history(roles, words), last]
    body: dict[str, Any] = {"model": MODEL}
    anthropic = route.startswith("/v1/messages")
    if anthropic:
        body.update(messages=_anthropic(messages), max_tokens=20)
        if thinking is not None:
            body["thinking"] = {"type": "enabled" if thinking else "disabled"}
    else:
        body["messages"] = messages
        if thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": thinking}
    if route in ("/v1/chat/completions", "/v1/messages"):
        body["stream"] = stream
    PROMPTS.clear()
    reply = edge.run_until_complete(request("POST", route, json.dumps(body).encode(), JSON))
    event(f"{route} {reply.status} {reply.body[:90]!r}" if reply.status != 200 else f"{route} 200")
    if reply.status != 200:
        assert 400 <= reply.status < 500, (reply.status, reply.body[:300])
        error = reply.json()["error"]
        if anthropic:
            assert reply.json()["type"] == "error" and error["type"] == "invalid_request_error", reply.body
        else:
            assert reply.is_error_object() and error["param"], reply.body
        assert not PROMPTS  # refused before anything ran
        return
    text = "\n".join(prefill) if isinstance(prefill, list) else prefill or ""
    prefilled = not last_calls and bool(text)
    if route == "/v1/chat/completions":
        assert said(reply, stream)["content"] == "ok"
        (prompt,) = PROMPTS.values()
        if prefilled:
            assert prompt.endswith(text.encode()), (prompt[-80:], text)
    elif route == "/apply-template" and prefilled:
        assert reply.json()["prompt"].endswith(text)
    elif route == "/v1/messages" and not stream:
        assert [b["text"] for b in reply.json()["content"] if b["type"] == "text"] == ["ok"]
