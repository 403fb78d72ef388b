"""A reply in tool mode streams what the same reply says unstreamed (content, calls,
finish_reason), whatever its chunking, also where a call's block never closed and where the
content begins with whitespace (session 49).

- A call whose head (an offered name, then its arguments' ``{``) came is streamed at once and
  cannot be taken back. Unstreamed, such a block without its ``</tool_call>`` (the end of
  generation or a stop string came first) was text, the call's raw markup as ``content``; it is
  the call, its arguments as they came, finished ``stop`` (as a cut at max_tokens is, ``length``).
- The stream sent the content's leading whitespace with the first text (it cannot know a call
  follows), where unstreamed the content around calls is stripped: in tool mode the content's
  leading whitespace is none of it, streamed or not.
- A call's closing that came in one delta with more than MAX_CALL_TAIL characters after it was
  sent as text (the bound counted what the delta held), where in small deltas it closed the call.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.anthropic import in_written_order, message_body
from api.responses import MAX_CALL_TAIL, Reply, json_bytes
from api.responses_api import custom_input
from scheduler.link.messages import Delta, Done
from tests.api.streamed import stream_reply, whole_reply

TOOLS = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
HEAD = '<tool_call>{"name": "get_weather", "arguments": '
CALL = HEAD + '{"city": "Paris"}}</tool_call>'


def _both(text: str, reason: str, size: int, **reply: object) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """(streamed in pieces of ``size``, unstreamed): content, calls, finish_reason."""
    fmt = str(reply.pop("tool_format", "hermes"))
    got = stream_reply([text[i : i + size] for i in range(0, len(text), size)], TOOLS, fmt=fmt, reason=reason, **reply)
    whole = whole_reply(text, TOOLS, reason, tool_format=fmt, **reply)
    return (got.content or None, got.pairs, got.finish_reason), (whole["content"], whole["calls"], whole["finish_reason"])


def test_a_call_whose_closing_never_came_is_the_call_finished_stop_unstreamed_too() -> None:
    text = HEAD + '{"city": "Paris"}}'
    for size in (1, 4, len(text)):
        streamed, whole = _both(text, "stop", size)
        assert streamed == whole == (None, [("get_weather", '{"city": "Paris"}')], "stop")


def test_a_call_cut_open_at_stop_is_the_call_as_far_as_it_came() -> None:
    text = HEAD + '{"city": "Pa'
    streamed, whole = _both(text, "stop", 3)
    assert streamed == whole == (None, [("get_weather", '{"city": "Pa')], "stop")
    # cut before its head was whole: no call was sent, the text is content
    text = '<tool_call>{"name": "get_wea'
    streamed, whole = _both(text, "stop", 3)
    assert streamed == whole == (text, [], "stop")


def test_a_whole_call_then_one_never_closed_finishes_stop() -> None:
    # the stream finished tool_calls: it counted the first call's closing and not the second's absence
    text = CALL + "\n" + HEAD + '{"city": "Oslo"}}'
    for size in (1, 5, len(text)):
        streamed, whole = _both(text, "stop", size)
        assert streamed == whole == (None, [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Oslo"}')], "stop")


def test_leading_whitespace_is_no_content_whether_or_not_a_call_follows() -> None:
    for text in (" \n Sure. " + CALL, " \n Sure.", "\n\n" + CALL + "\n Done."):
        for size in (1, 2, len(text)):
            streamed, whole = _both(text, "stop", size)
            assert streamed == whole, (text, size)
            assert not (whole[0] or "x")[0].isspace()


def test_a_closing_in_one_delta_with_long_text_after_it_closes_the_call() -> None:
    text = CALL + " and " + "x" * (MAX_CALL_TAIL + 100)
    for size in (7, len(text)):
        streamed, whole = _both(text, "stop", size)
        assert streamed == whole == ("and " + "x" * (MAX_CALL_TAIL + 100), [("get_weather", '{"city": "Paris"}')], "tool_calls")


PIECES = st.sampled_from(
    [HEAD, '{"city": "Paris"}', '{"city": "Pa', "}", "</tool_call>", "</tool", "NaN", ",", ' "id": "x"', '"parameters": ',
     " ", "\n", "Sure.", "<tool_call>", "<think>", "</think>", "[TOOL_CALLS]", '{"name": "get_weather", "arguments": {}}',
     "<function=get_weather>", "<parameter=city>", "Paris", "</parameter>", "</function>"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    parts=st.lists(PIECES, max_size=14),
    tool_format=st.sampled_from(["hermes", "llama3", "mistral", "qwen3_coder"]),
    reasoning=st.sampled_from(["none", "think"]),
    reason=st.sampled_from(["stop", "length"]),
    size=st.integers(1, 9),
)
def test_fuzz_any_reply_streams_its_unstreamed_content_calls_and_finish(parts: list[str], tool_format: str, reasoning: str, reason: str, size: int) -> None:
    text = "".join(parts)
    streamed, whole = _both(text, reason, size, tool_format=tool_format, reasoning_format=reasoning)
    assert streamed == whole, text


def test_tags_no_object_follows_are_no_misses_of_the_parse() -> None:
    # the stream sends each at once as text and still streams the call after them; the parse
    # counted each as a block that was no call, and after 16 gave the rest up as text
    text = "<tool_call> no\n" * 17 + CALL
    streamed, whole = _both(text, "stop", 5)
    assert streamed == whole == (("<tool_call> no\n" * 17).strip(), [("get_weather", '{"city": "Paris"}')], "tool_calls")


def _message(text: str, reason: str) -> dict[str, Any]:
    """/v1/messages' unstreamed message of ``text`` (MessagesConsumer.final_body's steps)."""
    reply = Reply("chat", "m", tools=TOOLS)
    reply.add(Delta("j", text))
    done = Done("j", reason, usage={"prompt_tokens": 1, "completion_tokens": 1})
    return in_written_order(message_body(reply.body(done, None), "m", None, [], done.usage, done.usage["completion_tokens"]), Reply("chat", "m", tools=TOOLS), [text], done)


def test_a_messages_call_whose_arguments_are_no_json_has_an_empty_input_and_a_json_body() -> None:
    # a call whose head came is one: its input was read by Python's reader, NaN and all (the body
    # then held NaN, which no JSON parser takes), and arguments nested too deep raised
    for args in ('{"city": NaN}', '{"a": ' + "[" * 20_000 + "]" * 20_000 + "}"):
        body = _message(HEAD + args + "}</tool_call>", "stop")
        assert [(b["type"], b.get("input")) for b in body["content"]] == [("tool_use", {})]
        assert body["stop_reason"] == "end_turn"  # no whole call: its arguments are no JSON
        json.loads(json_bytes(body), parse_constant=lambda c: pytest.fail(f"{c} in the body"))


def test_a_custom_tools_input_nested_past_the_readers_depth_is_given_as_written() -> None:
    # /v1/responses serves a custom tool as a function: arguments nested too deep raised
    # RecursionError out of the reply, now that such a block is a call unstreamed too
    deep = '{"input": ' + "[" * 20_000 + "]" * 20_000 + "}"
    assert custom_input(deep) == deep


def test_a_second_call_cut_at_max_tokens_beyond_the_one_call_allowed_finishes_as_the_first() -> None:
    # legacy functions (or parallel_tool_calls false) allow one call: a whole call, then a second
    # that max_tokens cut. Streamed it finished function_call (the second was never sent);
    # unstreamed "length", counted for the dropped call (Hypothesis, tests/edge/test_stream_equivalence.py)
    text = CALL + "\n" + HEAD + '{"city": "Os'
    for options in ({"legacy_functions": True, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, {"parallel_tool_calls": False}):
        for size in (1, 7, len(text)):
            streamed, whole = _both(text, "length", size, **options)
            assert streamed == whole, (options, size)
            if "legacy_functions" in options:  # (its call is message.function_call: the view reads tool_calls)
                assert streamed[2] == "function_call"
            else:
                assert streamed[1] == [("get_weather", '{"city": "Paris"}')]
