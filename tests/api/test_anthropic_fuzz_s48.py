"""Hypothesis fuzz of the Messages API's translation (api/anthropic.py): any body is a chat
request or a 4xx refusal (never another exception); the streamed events of any chat reply add
up to the message the same reply unstreamed is; and through the middle layer any body gets a
reply or a 4xx in Anthropic's error shape, never a 500 and never a hang."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from api.anthropic import BlockStream, in_written_order, message_body, parse_messages_request, stop_reason
from api.errors import ApiError
from api.responses import Reply
from api.schemas import omitted_part
from scheduler.link.messages import Delta, Done
from tests.edge.inproc import JSON, MODEL, SimWorker, attached_loop, request
from tests.edge.strategies import field_values, json_values, nasty_text

MODELS = [MODEL]
TEXT = st.text(max_size=12)
HOSTILE = nasty_text | field_values()
KINDS = st.sampled_from(["text", "tool_use", "tool_result", "thinking", "redacted_thinking", "image", "document", "other"])
# what each role's blocks are, in a body as a client means it
ROLE_KINDS = {"user": st.sampled_from(["text", "text", "tool_result", "image"]), "assistant": st.sampled_from(["text", "text", "tool_use", "thinking", "redacted_thinking"])}
# an image as Claude Code sends one (its Read tool's PNG, a pasted picture)
SOURCES = st.sampled_from([{"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}, {"type": "url", "url": "https://x.test/a.png"}, {"type": "file", "file_id": "file_1"}])


def sometimes(draw: st.DrawFn, hostile: bool, valid: st.SearchStrategy[Any], bad: st.SearchStrategy[Any] = HOSTILE) -> Any:
    """A field's value: as a client means it, or (in a hostile body, one time in four) anything."""
    return draw(bad if hostile and draw(st.integers(0, 3)) == 0 else valid)


@st.composite
def block(draw: st.DrawFn, role: str, hostile: bool) -> Any:
    if hostile and draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    kind = draw(KINDS if hostile else ROLE_KINDS[role])
    out: dict[str, Any] = {"type": kind}
    result_block = st.fixed_dictionaries({"type": st.sampled_from(["text", "text", "image"]), "text": TEXT}) if hostile else st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})
    image = st.fixed_dictionaries({"type": st.just("image"), "source": SOURCES if not hostile else SOURCES | field_values()})
    result_content = TEXT | st.lists(result_block | image, max_size=2)
    fields = {
        "text": {"text": TEXT},
        "tool_use": {"id": TEXT.map(lambda t: "toolu_" + t), "name": st.sampled_from(["get_weather", "f"]), "input": st.dictionaries(TEXT, TEXT, max_size=2)},
        "tool_result": {"tool_use_id": TEXT.map(lambda t: "toolu_" + t), "content": result_content, "is_error": st.none() | st.booleans()},
        "thinking": {"thinking": TEXT, "signature": TEXT},
        "redacted_thinking": {"data": TEXT},
        "image": {"source": SOURCES},
    }.get(kind, {"source": field_values()})
    for key, values in fields.items():
        if not hostile or draw(st.integers(0, 9)):
            out[key] = sometimes(draw, hostile, values)
    if draw(st.integers(0, 3)) == 0:
        out["cache_control"] = sometimes(draw, hostile, st.just({"type": "ephemeral"}))
    return out


@st.composite
def messages_body(draw: st.DrawFn) -> dict[str, Any]:
    hostile = draw(st.booleans())

    def msg(role: str) -> Any:
        if hostile and draw(st.integers(0, 9)) == 0:
            return draw(json_values)
        out: dict[str, Any] = {"role": sometimes(draw, hostile, st.just(role))}
        if not hostile or draw(st.integers(0, 9)):
            out["content"] = sometimes(draw, hostile, TEXT | st.lists(block(role, hostile), min_size=1, max_size=4))
        if draw(st.integers(0, 9)) == 0:
            out[draw(st.text(max_size=5))] = draw(field_values())
        return out

    turns = draw(st.integers(0 if hostile else 1, 4))
    body: dict[str, Any] = {
        "model": sometimes(draw, hostile, st.just(MODEL), st.just("nope") | HOSTILE),
        "messages": [msg("user" if i % 2 == 0 else "assistant") for i in range(turns)],
    }
    tool = st.fixed_dictionaries(
        {"name": st.sampled_from(["f", "get_weather"])},
        optional={"description": TEXT, "input_schema": st.just({"type": "object", "properties": {"city": {"type": "string"}}}), "type": st.sampled_from(["custom", "bash_20250124"])},
    )
    optional = {
        "max_tokens": st.integers(1, 5000),
        "system": TEXT | st.lists(block("system", hostile) if hostile else st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=3),
        "tools": st.lists(tool, max_size=3),
        "tool_choice": st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "tool", "none"])}, optional={"name": st.sampled_from(["f", "get_weather"]), "disable_parallel_tool_use": st.booleans()}),
        "stop_sequences": st.lists(TEXT, max_size=20),
        "temperature": st.floats(0, 1),
        "top_p": st.floats(0, 1),
        "top_k": st.integers(0, 100),
        "thinking": st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled", "adaptive"])}, optional={"budget_tokens": st.integers(1024, 10**6)}),
        "metadata": st.fixed_dictionaries({"user_id": TEXT}),
        "stream": st.booleans(),
        "chat_template_kwargs": st.dictionaries(st.sampled_from(["enable_thinking", "x"]), st.booleans()),
        "unknown_thing": field_values(),
    }
    for key, values in optional.items():
        if draw(st.integers(0, 2)) == 0:
            body[key] = sometimes(draw, hostile, values)
    return body


def parse(body: Any, strict: bool) -> Any:
    raw = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return parse_messages_request(raw, models=MODELS, strict=strict)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=messages_body(), strict=st.booleans())
def test_any_body_is_a_chat_request_or_a_4xx(body: dict[str, Any], strict: bool) -> None:
    try:
        request = parse(body, strict)
    except ApiError as exc:
        assert 400 <= exc.status < 500 and exc.message, exc
        return
    assert request.endpoint == "chat" and request.messages and request.n == 1 and not request.prompts
    assert request.max_tokens is not None and request.max_tokens >= 1
    if strict:
        assert not [name for name in request.ignored if name != "thinking.budget_tokens"]
    # an image served (a user's, or in a tool result) stands omitted in the prompt and is named
    blocks = [b for m in body["messages"] if isinstance(m, dict) and isinstance(m.get("content"), list) for b in m["content"] if isinstance(b, dict)]
    inner = [b for r in blocks if r.get("type") == "tool_result" and isinstance(r.get("content"), list) for b in r["content"] if isinstance(b, dict)]
    if any(b.get("type") == "image" for b in blocks + inner):
        event("served with an image")
        assert not strict and "messages.image" in request.ignored
        assert any(omitted_part("image") in m["content"] for m in request.messages)


@settings(max_examples=200, deadline=None)
@given(body=json_values)
def test_any_json_is_a_chat_request_or_a_4xx(body: Any) -> None:
    try:
        parse(body, False)
    except ApiError as exc:
        assert 400 <= exc.status < 500, exc


# -- the reply: streamed events add up to the unstreamed message -----------------------------------

TOOLS = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
PIECES = st.lists(
    st.sampled_from(["Hi", " there", "\n", "<tool_call>", '{"name": "get_weather", ', '"arguments": {"city": "Paris"}}', "</tool_call>", "<think>", "</think>", "ok", "{", "}"]),
    max_size=14,
)


def assemble(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The content blocks a client puts together from a stream's events (as the SDK does)."""
    blocks: list[dict[str, Any]] = []
    buffers: dict[int, str] = {}
    open_: int | None = None
    for frame in frames:
        if frame["type"] == "content_block_start":
            assert open_ is None and frame["index"] == len(blocks), frames
            blocks.append(dict(frame["content_block"]))
            open_ = frame["index"]
        elif frame["type"] == "content_block_delta":
            assert frame["index"] == open_, frames
            delta, target = frame["delta"], blocks[frame["index"]]
            if delta["type"] == "text_delta":
                target["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                target["thinking"] += delta["thinking"]
            else:
                buffers[frame["index"]] = buffers.get(frame["index"], "") + delta["partial_json"]
        elif frame["type"] == "content_block_stop":
            assert frame["index"] == open_, frames
            open_ = None
    assert open_ is None
    for i, text in buffers.items():
        try:
            value = json.loads(text)
        except ValueError:
            value = {}
        blocks[i]["input"] = value if isinstance(value, dict) else {}
    return blocks


@settings(max_examples=300, deadline=None)
@given(pieces=PIECES, tools=st.booleans(), reasoning=st.sampled_from(["none", "think"]), reason=st.sampled_from(["stop", "length"]))
def test_the_streamed_blocks_are_the_unstreamed_message(pieces: list[str], tools: bool, reasoning: str, reason: str) -> None:
    def reply() -> Reply:
        return Reply("chat", MODEL, tools=TOOLS if tools else None, reasoning_format=reasoning)

    streamed, whole = reply(), reply()
    blocks = BlockStream()
    frames: list[dict[str, Any]] = []
    for i, piece in enumerate(pieces):
        event = Delta(id="j", text=piece, tokens=i + 1)
        frames += blocks.feed(streamed.delta_chunks(event))
        whole.add(event)
    done = Done(id="j", finish_reason=reason, usage={"prompt_tokens": 3, "completion_tokens": len(pieces)})
    chunks = streamed.final_chunks(done, None)
    frames += blocks.feed(chunks) + blocks.close()
    # the route's unstreamed message: its blocks in the order the model wrote them (MessagesConsumer.final_body)
    body = in_written_order(message_body(whole.body(done, None), MODEL, None, [], done.usage, len(pieces)), reply(), whole.text, done)
    got = assemble(frames)
    assert [b["type"] for b in got] == [b["type"] for b in body["content"]], (pieces, frames, body)
    for a, b in zip(got, body["content"], strict=True):
        if a["type"] == "tool_use":
            assert (a["name"], a["input"]) == (b["name"], b["input"])
            assert a["id"].startswith("toolu_")
        else:
            assert a == b
    finish = next(c["choices"][0]["finish_reason"] for c in reversed(chunks) if c.get("choices"))
    assert stop_reason(finish, None, [])[0] == body["stop_reason"]


# -- through the middle layer -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def edge() -> Iterator[asyncio.AbstractEventLoop]:
    with attached_loop(SimWorker(lanes=4, lane_ctx=512)) as loop:
        yield loop


@pytest.mark.django_db(transaction=True)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=messages_body(), path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]))
def test_any_body_gets_a_reply_or_an_anthropic_4xx(edge: asyncio.AbstractEventLoop, body: dict[str, Any], path: str) -> None:
    if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 16:
        body["max_tokens"] = 16  # (a reply's length is not what is fuzzed)
    raw = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    reply = edge.run_until_complete(asyncio.wait_for(request("POST", path, raw, JSON), 30))
    assert reply.status < 500, reply.body
    event(f"{path} {reply.status}")
    if reply.status >= 400:
        error = reply.json()
        assert error["type"] == "error" and isinstance(error["error"]["message"], str) and error["error"]["type"].endswith("error"), error
    elif body.get("stream") is True and path == "/v1/messages":
        assert reply.body.startswith(b"event: message_start\n") and reply.body.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    else:
        assert reply.json()["type" if path == "/v1/messages" else "input_tokens"]
