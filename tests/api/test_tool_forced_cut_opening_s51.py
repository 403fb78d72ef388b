"""A forced tool call's reply that ``max_tokens`` cut inside a further call's opening: the
grammar of ``tool_choice`` ``required`` (up to 4 parallel calls) or a named function allows
nothing but calls, so what the cut leaves of an opening (``<tool_call>``, or ``<tool_call>`` and
the start of its ``{"name": ...``) is markup, never content. Against llama-server's peer
reading of a sweep (SmolLM2, ``tool_choice`` ``required``, ``max_tokens`` 40): the reply was the
call and ``content`` ``"<tool_call>"``, streamed and not."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.responses import Reply
from scheduler.link.messages import Delta, Done

TOOLS = [{"name": "get_weather"}, {"name": "g"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": { "city": "Paris" }}\n</tool_call>'
HEAD = '<tool_call>\n{"name": "get_weather", "arguments": {'  # a head whole: the call is streamed from here
NOPE = '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'  # a block of a function not offered: text


def replies(text: str, reason: str, pieces: list[int], **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the unstreamed message, the streamed one put together as the openai client does, with
    its finish_reason) of ``text`` generated in pieces of the given lengths."""
    whole = Reply("chat", "m", tools=TOOLS, **kw)
    whole.add(Delta("j", text))
    message = whole.body(Done("j", reason), None)["choices"][0]
    stream = Reply("chat", "m", tools=TOOLS, **kw)
    chunks: list[dict[str, Any]] = []
    at = 0
    for n in [*pieces, len(text)]:
        chunks += stream.delta_chunks(Delta("j", text[at : at + n]))
        at += n
    chunks += stream.final_chunks(Done("j", reason), None)
    content: str | None = None
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for c in chunks:
        choice = c["choices"][0]
        delta = choice["delta"]
        if delta.get("content"):
            content = (content or "") + delta["content"]
        for call in delta.get("tool_calls") or []:
            got = calls.setdefault(call["index"], {"name": "", "arguments": ""})
            got["name"] += call.get("function", {}).get("name") or ""
            got["arguments"] += call.get("function", {}).get("arguments") or ""
        finish = choice["finish_reason"] or finish
    return message, {"content": content, "calls": [calls[i] for i in sorted(calls)], "finish_reason": finish}


@pytest.mark.parametrize("tail", ["\n<tool_call>", "\n<tool_call>\n", "\n<tool", "\n<tool_call>\n{", '\n<tool_call>\n{"name": "get_wea'])
def test_a_second_calls_opening_cut_by_max_tokens_is_no_content(tail: str) -> None:
    message, streamed = replies(CALL + tail, "length", [7], tool_choice="required")
    assert message["message"]["content"] is None and streamed["content"] is None, (message, streamed)
    assert [c["function"]["name"] for c in message["message"]["tool_calls"]] == ["get_weather"]
    assert [c["name"] for c in streamed["calls"]] == ["get_weather"]
    assert message["finish_reason"] == streamed["finish_reason"] == "length"  # more calls could have come


@given(cut=st.integers(0, len(HEAD) - 1), pieces=st.lists(st.integers(1, 9), max_size=12), named=st.booleans())
def test_any_cut_inside_a_forced_replys_openings_leaves_no_markup_in_the_content(cut: int, pieces: list[int], named: bool) -> None:
    """Cut anywhere before the first call's head, or the second's, and generated in any pieces:
    the content is no markup, streamed or not; the whole calls stay calls."""
    kw: dict[str, Any] = {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}} if named else {"tool_choice": "required"}
    for text, calls in ((HEAD[:cut], 0), (CALL + "\n" + HEAD[:cut], 1)):
        if named and calls:
            continue  # (a named function is called once: the grammar allows no second opening)
        message, streamed = replies(text, "length", pieces, **kw)
        assert not message["message"]["content"] and streamed["content"] is None, (text, message, streamed)
        assert len(message["message"].get("tool_calls") or []) == len(streamed["calls"]) == calls


def test_text_of_an_auto_reply_cut_in_a_tag_stays_content_as_before() -> None:
    """``auto`` lets the model write words, a tag in them included: unchanged (docs/api.md,
    Tool calls: a head cut short is no call, its text content)."""
    message, streamed = replies("Let me see <tool_call>", "length", [3], tool_choice="auto")
    assert message["message"]["content"] == streamed["content"] == "Let me see <tool_call>"


@pytest.mark.parametrize("tail", ["<", "\n<tool_call>", '<tool_call>{"name": "g'])
def test_with_one_call_allowed_a_further_opening_cut_by_max_tokens_is_no_content_either(tail: str) -> None:
    """``parallel_tool_calls`` false: one call whole is the reply's end, so its finish_reason is
    ``tool_calls``; the unstreamed reply tested the cut against that and kept the opening as
    content where the stream had none (found by tests/edge/test_stream_equivalence.py)."""
    message, streamed = replies(CALL + tail, "length", [5], tool_choice="required", parallel_tool_calls=False)
    assert message["message"]["content"] is None and streamed["content"] is None, (message, streamed)
    assert message["finish_reason"] == streamed["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    ("text", "content"),
    [(",<tool_call>" + CALL[11:] + "<", ",<"), ("Hello<", "Hello<"), ("Hi <tool_call>\n{", "Hi <tool_call>\n{"), (NOPE + "<", NOPE + "<")],
)
def test_an_opening_cut_after_text_the_model_wrote_stays_content_streamed_or_not(text: str, content: str) -> None:
    """Text the model wrote before or between forced calls (no grammar: the simulated engine) and
    an opening ``max_tokens`` cut after it: content, streamed or not. The stream had sent the
    text and dropped the opening it held, where the unstreamed content, tested whole, kept it
    (found by tests/edge/test_stream_equivalence.py); nothing the model wrote is dropped."""
    for kw in ({"tool_choice": "required"}, {"tool_choice": {"type": "function", "function": {"name": "g"}}}):
        message, streamed = replies(text, "length", [1], **kw)
        assert message["message"]["content"] == streamed["content"] == content, (kw, message, streamed)


def test_a_tag_followed_by_no_json_is_text_streamed_or_not() -> None:
    """``<tool_call>H``: no call's head follows the tag (a stream sends it as text at once), so it
    is no cut opening either (found by tests/edge/test_stream_equivalence.py)."""
    message, streamed = replies("<tool_call>Hello", "length", [1], tool_choice="required")
    assert message["message"]["content"] == streamed["content"] == "<tool_call>Hello", (message, streamed)
