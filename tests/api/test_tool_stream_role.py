"""A streamed reply that is only tool calls reassembles to ``content: null``.

OpenAI streams such a reply's first chunk as ``{"role": "assistant", "content": null,
"tool_calls": [...]}``, and a text reply's as ``{"role": "assistant", "content": ""}``; the
``openai`` package's stream helper accumulates the deltas into the message. Superfluid sent the
role chunk with ``content: ""`` before it knew which the reply was, so a client reassembling a
tool-call reply got ``""`` where the same reply unstreamed (and OpenAI's stream) has null."""

from __future__ import annotations

from typing import Any

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from api.responses import Reply
from scheduler.link.messages import Delta, Done

TOOLS = [{"name": "f"}, {"name": "g"}]
CALL = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'


def _frames(text: str, cut: int, reason: str = "stop", **kw: Any) -> list[dict[str, Any]]:
    reply = Reply("chat", "m", tools=TOOLS, **kw)
    frames = reply.first_chunks()
    for i in range(0, len(text), cut):
        frames += reply.delta_chunks(Delta("j", text[i : i + cut]))
    return frames + reply.final_chunks(Done("j", reason), None)


def _unstreamed(text: str, reason: str = "stop", **kw: Any) -> dict[str, Any]:
    reply = Reply("chat", "m", tools=TOOLS, **kw)
    reply.add(Delta("j", text))
    return reply.body(Done("j", reason), None)["choices"][0]["message"]


def _accumulated(frames: list[dict[str, Any]]) -> Any:
    state = ChatCompletionStreamState()
    for frame in frames:
        state.handle_chunk(ChatCompletionChunk.model_validate(frame))
    return state.get_final_completion().choices[0].message


@pytest.mark.parametrize("text", [CALL, CALL + "\n" + CALL.replace('"f"', '"g"'), "  " + CALL, '<tool_call>{"arguments": {}, "name": "f"}</tool_call>'])
@pytest.mark.parametrize("cut", [1, 4, 1000])
def test_a_streamed_reply_of_calls_only_reassembles_to_null_content_as_unstreamed(text: str, cut: int) -> None:
    frames = _frames(text, cut)
    message = _accumulated(frames)
    assert _unstreamed(text)["content"] is None
    assert message.content is None
    assert [c.function.name for c in message.tool_calls or []] == [c["function"]["name"] for c in _unstreamed(text)["tool_calls"]]
    # the first chunk carries the role, as OpenAI's does
    assert frames[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum("role" in f["choices"][0]["delta"] for f in frames if f["choices"]) == 1


@pytest.mark.parametrize("text", ["Hello there.", "", "Sure. " + CALL, "<tool_c", "   "])
@pytest.mark.parametrize("cut", [1, 1000])
def test_a_streamed_reply_with_text_reassembles_to_the_unstreamed_content(text: str, cut: int) -> None:
    frames = _frames(text, cut)
    message = _accumulated(frames)
    assert message.content == _unstreamed(text)["content"]
    assert frames[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert sum("role" in f["choices"][0]["delta"] for f in frames if f["choices"]) == 1


def test_the_legacy_function_call_stream_reassembles_to_null_content() -> None:
    frames = _frames(CALL, 3, legacy_functions=True)
    message = _accumulated(frames)
    assert message.content is None and message.function_call is not None and message.function_call.name == "f"


def _logprob_frames(text: str, cut: int) -> list[dict[str, Any]]:
    """As ``_frames``, with logprobs asked for: each piece of text one token's entry."""
    reply = Reply("chat", "m", tools=TOOLS, logprobs=True)
    frames = reply.first_chunks()
    for i in range(0, len(text), cut):
        piece = text[i : i + cut]
        entry = {"token_id": i, "bytes": list(piece.encode()), "logprob": -0.5, "top": []}
        frames += reply.delta_chunks(Delta("j", piece, logprobs=[entry]))
    return frames + reply.final_chunks(Done("j", "stop"), None)


@pytest.mark.parametrize("text", [CALL, "  " + CALL])
@pytest.mark.parametrize("cut", [1, 4, 1000])
def test_with_logprobs_a_reply_of_calls_only_still_reassembles_to_null_content(text: str, cut: int) -> None:
    """The entries of a call's tokens went out in chunks of ``content: ""``, so the role came
    first with ``content: ""`` and the reply reassembled to "" where unstreamed it is null."""
    frames = _logprob_frames(text, cut)
    message = _accumulated(frames)
    assert message.content is None
    assert [c.function.name for c in message.tool_calls or []] == ["f"]
    assert sum("role" in f["choices"][0]["delta"] for f in frames if f["choices"]) == 1
    assert all(f["choices"][0]["delta"].get("content") is None for f in frames if f["choices"])
    # every token's entry still goes out, once, in order
    got = [e["bytes"] for f in frames if f["choices"] and f["choices"][0]["logprobs"] for e in f["choices"][0]["logprobs"]["content"]]
    assert b"".join(bytes(b) for b in got) == text.encode()


@pytest.mark.parametrize("cut", [1, 1000])
def test_with_logprobs_a_text_reply_still_opens_with_empty_content_and_reassembles(cut: int) -> None:
    frames = _logprob_frames("Sure. " + CALL, cut)
    message = _accumulated(frames)
    assert message.content == _unstreamed("Sure. " + CALL)["content"]
    assert frames[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
