"""A streamed call whose arguments nest deeper than Python's JSON reader recurses (a model told
to write a thousand ``[``) ends as the same reply unstreamed does: the arguments are no JSON
the client can rely on, so the reply finishes ``stop``; checking them must not raise
RecursionError out of the stream. Unstreamed, the call is the one the stream sent (its head came),
its arguments as the model wrote them."""

from __future__ import annotations

import json

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from api.responses import Reply
from scheduler.link.messages import Delta, Done

TOOLS = [{"name": "f"}]


def _call(depth: int) -> str:
    return '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * depth + "]" * depth + "}}</tool_call>"


@pytest.mark.parametrize("depth", [1000, 20000])
@pytest.mark.parametrize("cut", [7, 4096])
def test_deeply_nested_streamed_arguments_finish_stop_as_unstreamed(depth: int, cut: int) -> None:
    text = _call(depth)
    whole = Reply("chat", "m", tools=TOOLS)
    whole.add(Delta("j", text))
    body = whole.body(Done("j", "stop"), None)
    assert body["choices"][0]["finish_reason"] == "stop"
    unstreamed = [c["function"]["arguments"] for c in body["choices"][0]["message"]["tool_calls"]]

    reply = Reply("chat", "m", tools=TOOLS)
    chunks = reply.first_chunks()
    for i in range(0, len(text), cut):
        chunks += reply.delta_chunks(Delta("j", text[i : i + cut]))
    chunks += reply.final_chunks(Done("j", "stop"), None)
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(json.loads(json.dumps(chunk))))
    choice = state.current_completion_snapshot.choices[0]
    assert choice.finish_reason == "stop"  # the call went out, but it is no whole call
    # the arguments streamed are exactly what the model wrote (a client's parser refuses them),
    # and the same unstreamed
    assert [c.function.arguments for c in choice.message.tool_calls or []] == ["{\"a\": " + "[" * depth + "]" * depth + "}"] == unstreamed


def test_a_shallow_call_after_the_deep_one_still_streams() -> None:
    text = _call(1000) + '<tool_call>{"name": "f", "arguments": {"b": 2}}</tool_call>'
    reply = Reply("chat", "m", tools=TOOLS)
    chunks = [c for i in range(0, len(text), 512) for c in reply.delta_chunks(Delta("j", text[i : i + 512]))]
    chunks += reply.final_chunks(Done("j", "stop"), None)
    args = [tc["function"]["arguments"] for c in chunks for ch in c["choices"] for tc in ch["delta"].get("tool_calls") or [] if "id" not in tc]
    assert "".join(args).endswith('{"b": 2}')
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
