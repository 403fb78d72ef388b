"""A reply cut by max_tokens inside a tool call, unstreamed: the call as far as its arguments
came, as the stream gives it (tests/api/test_responses.py: a streamed call's arguments go out as
they are generated), not the call's raw markup as ``content``. An agent that set max_tokens too
low for a forced call (tool_choice required) got ``content: '<tool_call>\\n{"name": ...'`` and no
call unstreamed, and a call with partial arguments streamed."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.api.streamed import stream_reply, whole_reply

TOOLS = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>'


def body(text: str, reason: str, **kw: Any) -> dict[str, Any]:
    return whole_reply(text, TOOLS, reason, **kw)


def test_a_second_call_cut_in_its_arguments_is_a_call_not_content() -> None:
    text = CALL + "\n" + '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ly'
    got = body(text, "length")
    assert got == {"content": None, "calls": [("get_weather", '{"city": "Paris", "days": [1, 2]}'), ("get_weather", '{"city": "Ly')], "finish_reason": "length"}


def test_a_call_cut_in_its_closing_keeps_its_arguments_as_written() -> None:
    got = body('<tool_call>\n{"name": "get_weather", "arguments": {"city":"Oslo"}}\n</tool_c', "length")
    assert got["calls"] == [("get_weather", '{"city":"Oslo"}')] and got["content"] is None


def test_a_reply_that_stopped_is_read_as_a_cut_call_and_one_naming_no_offered_function_is_not() -> None:
    # the end of generation or a stop string cut it: the call the stream sent, finished "stop"
    unfinished = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ly'
    assert body(unfinished, "stop") == {"content": None, "calls": [("get_weather", '{"city": "Ly')], "finish_reason": "stop"}
    other = '<tool_call>\n{"name": "rm_rf", "arguments": {"path": "/'
    assert body(other, "length") == {"content": other, "calls": [], "finish_reason": "length"}


def test_one_call_a_turn_keeps_the_first_when_the_second_was_cut() -> None:
    text = CALL + "\n" + '<tool_call>\n{"name": "get_weather", "arguments": {"ci'
    assert body(text, "length", parallel_tool_calls=False)["calls"] == [("get_weather", '{"city": "Paris", "days": [1, 2]}')]


@settings(max_examples=300, deadline=None)
@given(
    before=st.sampled_from(["", "Let me check. ", " \n"]),
    calls=st.integers(0, 2),
    cut=st.integers(0, len(CALL)),
    size=st.integers(1, 12),
    reason=st.sampled_from(["length", "stop"]),
)
def test_unstreamed_a_reply_cut_anywhere_in_a_call_reads_as_the_stream_does(before: str, calls: int, cut: int, size: int, reason: str) -> None:
    # cut by max_tokens (length), or by a stop string or the end of generation (stop)
    text = before + "\n".join([CALL] * calls) + ("\n" if calls else "") + CALL[:cut]
    whole = body(text, reason)
    streamed = stream_reply([text[i : i + size] for i in range(0, len(text), size)], TOOLS, reason=reason)
    assert whole == {"content": streamed.content or None, "calls": streamed.pairs, "finish_reason": streamed.finish_reason}, (text, whole, streamed)


# a call whose arguments' string holds the closing tag's text (an agent writing code about tool calls)
MARKUP_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a </tool_call> b", "days": [1]}}\n</tool_call>'


def test_a_call_cut_after_a_closing_tag_inside_its_string_is_a_call_not_content() -> None:
    """A ``</tool_call>`` inside the arguments' string closes nothing: a reply cut after it is
    still inside the call. It was read as a whole call that did not parse, so the unstreamed
    reply was the raw markup as content, where the stream had sent the call."""
    cut = MARKUP_CALL[: MARKUP_CALL.index('b"')]
    assert body(cut, "length") == {"content": None, "calls": [("get_weather", '{"city": "a </tool_call> ')], "finish_reason": "length"}
    assert body(MARKUP_CALL, "stop")["calls"] == [("get_weather", '{"city": "a </tool_call> b", "days": [1]}')]


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(0, len(MARKUP_CALL)), size=st.integers(1, 12))
def test_unstreamed_a_call_with_the_closing_tag_in_its_string_cut_anywhere_reads_as_the_stream_does(cut: int, size: int) -> None:
    text = MARKUP_CALL[:cut]
    whole = body(text, "length")
    streamed = stream_reply([text[i : i + size] for i in range(0, len(text), size)], TOOLS, reason="length")
    assert whole["calls"] == streamed.pairs, (text, whole, streamed)
    assert (whole["content"] or "").strip() == (streamed.content or "").strip(), (text, whole, streamed)
