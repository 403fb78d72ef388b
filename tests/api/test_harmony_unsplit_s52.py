"""gpt-oss's reply left unsplit (reasoning_format none, or a prefill's continuation) with tools
offered: its calls are read all the same, as llama-server's gpt-oss parser reads them with
reasoning_format none (common/parsers/gpt-oss.cpp: the analysis is wrapped as content with its
markers, the final and preamble messages' text is content, the call is a call). Before, the reply
was read only for ``<tool_call>`` blocks, so the call came back as content text and finish_reason
stop: an agent's call was lost."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.reasoning import HARMONY_UNSPLIT, new_splitter
from api.responses import Reply
from scheduler.link.messages import Delta, Done
from tests.api.streamed import CUTS, assemble, cut_at, streamed_chunks, whole_view

TOOLS = [
    {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
    {"name": "f", "parameters": {"type": "object", "properties": {}}},
]
ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather in Paris. Call get_weather.<|end|>"
CALL = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}'
PREAMBLE = "<|start|>assistant<|channel|>commentary<|message|>Checking the forecast.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny."


def _reply(tools: Any, continues: bool, tool_format: str = "hermes") -> Reply:
    return Reply("chat", "m", tools=tools, reasoning_format=HARMONY_UNSPLIT, continues=continues, tool_format=tool_format)


def whole(text: str, tools: Any = TOOLS, *, continues: bool = False, reason: str = "stop", tool_format: str = "hermes") -> dict[str, Any]:
    reply = _reply(tools, continues, tool_format)
    reply.add(Delta("j", text))
    return whole_view(reply.body(Done("j", reason), None)["choices"][0])


def streamed(
    pieces: list[str], tools: Any = TOOLS, *, continues: bool = False, reason: str = "stop", tool_format: str = "hermes"
) -> dict[str, Any]:
    reply = _reply(tools, continues, tool_format)
    return assemble(reply.first_chunks() + streamed_chunks(reply, pieces, reason)).view()


def both(text: str, **kw: Any) -> dict[str, Any]:
    """The unstreamed reply's view, once the reply streamed a character at a time says the same."""
    got = whole(text, **kw)
    assert streamed(list(text), **kw) == got
    return got


@pytest.mark.parametrize(
    ("text", "content"),
    [
        (ANALYSIS + CALL, ANALYSIS),  # the analysis as llama-server keeps it: markers and all
        (ANALYSIS + PREAMBLE + CALL, ANALYSIS + "Checking the forecast."),  # a preamble's text, no header
        (CALL[len("<|start|>assistant") :], None),  # a call first
        # the recipient in the role's header
        (ANALYSIS + '<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city":"Paris"}', ANALYSIS),
    ],
)
def test_a_gpt_oss_call_in_an_unsplit_reply_is_a_call(text: str, content: str | None) -> None:
    assert both(text) == {"reasoning": None, "content": content, "calls": [("get_weather", '{"city":"Paris"}')], "finish_reason": "tool_calls"}


def test_an_unsplit_reply_without_a_call_is_content_as_llama_server_gives_it() -> None:
    got = both(ANALYSIS + FINAL)
    assert got == {"reasoning": None, "content": ANALYSIS + "It is sunny.", "calls": [], "finish_reason": "stop"}


def test_a_call_nobody_offered_is_dropped_with_tools_or_without() -> None:
    assert both(ANALYSIS + CALL.replace("get_weather", "get_time"))["calls"] == []
    # without tools the reply is read as llama-server reads it then (session 53: before, it came
    # back raw, headers and all): tests/api/test_harmony_unsplit_s53.py
    assert new_splitter(HARMONY_UNSPLIT, calls=()) is not None
    assert both(ANALYSIS + CALL, tools=None)["content"] == ANALYSIS


@pytest.mark.parametrize(
    ("text", "content"),
    [
        # a prefill "<|channel|>analysis<|message|>The user wants" continued: the rest of the
        # analysis as written, then the call
        (" the weather. Call get_weather.<|end|>" + CALL, " the weather. Call get_weather.<|end|>"),
        # a prefill of a whole analysis message: the reply opens the call's message
        (CALL, None),
        ("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}", None),
    ],
)
def test_a_prefilled_gpt_oss_reply_with_a_call_is_a_call(text: str, content: str | None) -> None:
    got = both(text, continues=True)
    assert got == {"reasoning": None, "content": content, "calls": [("get_weather", '{"city":"Paris"}')], "finish_reason": "tool_calls"}


def test_a_prefilled_reply_of_text_is_its_text_as_written() -> None:
    assert both(" Paris.", continues=True)["content"] == " Paris."


def test_a_call_cut_by_max_tokens_is_a_cut_call() -> None:
    got = both(ANALYSIS + CALL[:-3], reason="length")
    assert got == {"reasoning": None, "content": ANALYSIS, "calls": [("get_weather", '{"city":"Pari')], "finish_reason": "length"}


PIECES = [
    "<|channel|>", "analysis", "final", "commentary", " to=functions.get_weather", " to=functions.f", " to=browser.open",
    " to=assistant", "<|message|>", "<|start|>", "assistant", "<|end|>", " <|constrain|>json", "<|", "|>",
    '{"city":"P"}', "{}", "{", "}", '"', "<tool_call>", "</tool_call>", " ", "\n", "x", "é",
    # a generic call's head and Qwen3-Coder's tags: in an analysis kept as written, no call
    '{"name": "get_weather", "arguments": ', "<function=get_weather>", "<parameter=city>", "</function>",
]  # fmt: skip


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.lists(st.sampled_from(PIECES), max_size=24).map("".join),
    tools=st.sampled_from([None, TOOLS]),
    tool_format=st.sampled_from(["hermes", "qwen3_coder"]),
    continues=st.booleans(),
    reason=st.sampled_from(["stop", "length"]),
    cuts=CUTS,
)
def test_any_split_of_any_unsplit_harmony_reply_streams_what_the_whole_reply_says(
    text: str, tools: Any, tool_format: str, continues: bool, reason: str, cuts: list[int]
) -> None:
    said = {"continues": continues, "reason": reason, "tool_format": tool_format}
    got = whole(text, tools, **said)
    assert got["reasoning"] is None  # nothing is split out as reasoning
    assert streamed(cut_at(text, cuts), tools, **said) == got
