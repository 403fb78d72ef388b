"""A gpt-oss reply cut by max_tokens inside a tool call: the call as far as its arguments came,
streamed or not, as a call in the generic format so cut (tests/api/test_tool_cut_unstreamed_s47.py).
The harmony splitter closed the call it had opened (``}</tool_call>`` after arguments that were
cut), so unstreamed the reply's ``content`` was ``<tool_call>{"name": "get_weather", "arguments":
{"city": "Pa}</tool_call>``, markup the model never wrote, and no call; streamed, the call's
arguments ended in ``}</tool_call>``."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.api.streamed import stream_reply, whole_reply

TOOLS = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather. "
CALL = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'


def body(text: str, reason: str) -> dict[str, Any]:
    return whole_reply(text, TOOLS, reason, reasoning_format="harmony")


def test_a_call_cut_in_its_arguments_is_the_call_as_far_as_they_came() -> None:
    text = ANALYSIS + CALL[: -len('ris"}')]
    want = {"content": None, "calls": [("get_weather", '{"city": "Pa')], "finish_reason": "length"}
    assert body(text, "length") == want
    streamed = stream_reply([text[i : i + 5] for i in range(0, len(text), 5)], TOOLS, reason="length", reasoning_format="harmony")
    assert (streamed.content, streamed.pairs) == (None, want["calls"])


def test_a_call_the_model_ended_is_whole_and_one_cut_before_its_arguments_is_none() -> None:
    assert body(ANALYSIS + CALL, "stop") == {"content": None, "calls": [("get_weather", '{"city": "Paris"}')], "finish_reason": "tool_calls"}
    assert body(ANALYSIS + CALL[: CALL.index("{")], "length") == {"content": None, "calls": [], "finish_reason": "length"}


@settings(max_examples=300, deadline=None)
@given(before=st.sampled_from(["", ANALYSIS, ANALYSIS + "<|start|>assistant<|channel|>commentary<|message|>Checking. "]), calls=st.integers(0, 2), cut=st.integers(0, len(CALL)), size=st.integers(1, 12))
def test_a_reply_cut_anywhere_in_a_call_reads_the_same_streamed_or_not(before: str, calls: int, cut: int, size: int) -> None:
    text = before + CALL * calls + CALL[:cut]
    whole = body(text, "length")
    streamed = stream_reply([text[i : i + size] for i in range(0, len(text), size)], TOOLS, reason="length", reasoning_format="harmony")
    assert whole["calls"] == streamed.pairs, (text, whole, streamed)
    assert (whole["content"] or "").strip() == (streamed.content or "").strip(), (text, whole, streamed)
    assert "<tool_call>" not in (whole["content"] or "") + (streamed.content or "")


def test_a_call_a_stop_string_cuts_is_the_call_as_far_as_it_came() -> None:
    """A stop string that matches inside a call's arguments ends the reply there, as max_tokens
    does: the splitter closed the call after the cut arguments (``{"city": "Pa}</tool_call>``),
    since only ``length`` counted as a cut. Now the call as far as it came, as the generic
    format's (``finish_reason`` ``stop``: a stop string ended it)."""
    text = ANALYSIS + CALL[: -len('ris"}')]
    want = {"content": None, "calls": [("get_weather", '{"city": "Pa')], "finish_reason": "stop"}
    assert whole_reply(text, TOOLS, "stop", stop_word="ris", reasoning_format="harmony") == want
    streamed = stream_reply([text[i : i + 5] for i in range(0, len(text), 5)], TOOLS, stop_word="ris", reasoning_format="harmony")
    assert (streamed.content, streamed.pairs) == (None, want["calls"])


@settings(max_examples=200, deadline=None)
@given(calls=st.integers(0, 2), cut=st.integers(0, len(CALL)), size=st.integers(1, 12), stop=st.text(alphabet='ris"}P', min_size=1, max_size=3))
def test_a_reply_a_stop_string_cuts_anywhere_in_a_call_reads_the_same_streamed_or_not(calls: int, cut: int, size: int, stop: str) -> None:
    text = ANALYSIS + CALL * calls + CALL[:cut]
    whole = whole_reply(text, TOOLS, "stop", stop_word=stop, reasoning_format="harmony")
    streamed = stream_reply([text[i : i + size] for i in range(0, len(text), size)], TOOLS, stop_word=stop, reasoning_format="harmony")
    assert whole["calls"] == streamed.pairs, (text, whole, streamed)
    assert (whole["content"] or "").strip() == (streamed.content or "").strip(), (text, whole, streamed)
    assert not any("</tool_call>" in args for _, args in whole["calls"]), whole
    assert "<tool_call>" not in (whole["content"] or "") + (streamed.content or "")
