"""A ``<tool_call>`` tag that no JSON object follows is no call (the unstreamed reply keeps it in
its content as text), yet a stream held it and everything after it until the end of the reply:
a model that wrote the tag and then prose went silent for the rest of its answer."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from api.responses import Reply
from scheduler.link.messages import Delta, Done

TOOLS = [{"name": "get_weather"}]


def streamed(pieces: list[str]) -> tuple[list[str], str]:
    """(the content each delta sent, the content the end of the reply sent) of a stream."""
    reply = Reply("chat", "m", tools=TOOLS)
    per_delta = ["".join(c["choices"][0]["delta"].get("content") or "" for c in reply.delta_chunks(Delta("j", p))) for p in pieces]
    end = "".join(c["choices"][0]["delta"].get("content") or "" for c in reply.final_chunks(Done("j", "stop"), None))
    return per_delta, end


def unstreamed(text: str) -> dict:  # type: ignore[type-arg]
    reply = Reply("chat", "m", tools=TOOLS)
    reply.add(Delta("j", text))
    return reply.body(Done("j", "stop"), None)["choices"][0]["message"]


def test_prose_after_a_stray_tag_streams_as_it_comes() -> None:
    pieces = ["I would call <tool_call>", " but I", " cannot reach the", " weather service today."]
    per_delta, end = streamed(pieces)
    assert per_delta[2].endswith("cannot reach the"), per_delta  # not held to the end
    assert "".join(per_delta) + end == unstreamed("".join(pieces))["content"]


def test_a_call_after_a_stray_tag_is_still_a_call() -> None:
    text = 'Note: <tool_call> is how I call. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    message = unstreamed(text)
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    reply = Reply("chat", "m", tools=TOOLS)
    frames = reply.delta_chunks(Delta("j", text[:40])) + reply.delta_chunks(Delta("j", text[40:])) + reply.final_chunks(Done("j", "tool_calls"), None)
    calls = [tc for f in frames for tc in f["choices"][0]["delta"].get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "get_weather"
    assert "".join(tc["function"].get("arguments") or "" for tc in calls) == message["tool_calls"][0]["function"]["arguments"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["<tool_call>", "<tool", "_call>", " ", "\n", "hi", "{", '"name"', ": ", '"get_weather"', ", ", '"arguments"', "}", "</tool_call>", "x"]), max_size=24),
    st.data(),
)
def test_any_text_streams_to_the_content_and_calls_it_has_unstreamed(words: list[str], data: st.DataObject) -> None:
    text = "".join(words)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=6)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    reply = Reply("chat", "m", tools=TOOLS)
    frames = [f for p in pieces for f in reply.delta_chunks(Delta("j", p))] + reply.final_chunks(Done("j", "stop"), None)
    content = "".join(f["choices"][0]["delta"].get("content") or "" for f in frames)
    calls = [tc for f in frames for tc in f["choices"][0]["delta"].get("tool_calls") or []]
    message = unstreamed(text)
    assert content == (message["content"] or ""), (pieces, content, message)
    assert len([c for c in calls if "id" in c]) == len(message.get("tool_calls") or [])
