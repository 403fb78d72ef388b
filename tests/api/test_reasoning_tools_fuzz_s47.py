"""Fuzz: a reasoning model's reply (``<think>`` blocks, gpt-oss's harmony channels) in any of the
tool-call formats read beside it (the generic JSON ``<tool_call>``, Qwen3-Coder's and GLM's
tags), made of the markers' pieces in any order, streams in any split what the whole reply
says: the same reasoning_content, content, calls and finish reason. A hostile (or broken) model
writes markers anywhere; what the client is told must not depend on how the text was cut."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.streamed import CUTS, cut_at
from tests.api.test_reasoning_s47 import _streamed, _whole

TOOLS = [
    {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}},
    {"name": "f", "parameters": {"type": "object", "properties": {}}},
]
FRAGMENTS = [
    "<think>", "</think>", "<thin", "</th",
    "<|channel|>", "analysis", "final", "commentary", " to=functions.get_weather", " to=functions.f", " to=browser.open",
    "<|message|>", "<|start|>", "assistant", "<|end|>", " <|constrain|>json", "<|",
    "<tool_call>", "</tool_call>", "<tool_call>\n", '{"name": "get_weather", "arguments": ', '{"city": "P"}', "}", "{", '"',
    "<function=get_weather>", "<function=f>", "<function=", "<parameter=city>", "<parameter=days>", "</parameter>", "</function>",
    "get_weather", "<arg_key>", "city", "</arg_key>", "<arg_value>", "</arg_value>",
    " ", "\n", "x", "<", ">", "|", "3", "é",
]  # fmt: skip
replies = st.lists(st.sampled_from(FRAGMENTS), max_size=24).map("".join)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=replies,
    fmt=st.sampled_from(["think", "think-open", "harmony"]),
    tool_format=st.sampled_from(["hermes", "qwen3_coder", "glm45"]),
    tools=st.sampled_from([None, TOOLS]),
    reason=st.sampled_from(["stop", "length"]),
    cuts=CUTS,
)
def test_any_split_of_any_reply_streams_what_the_whole_reply_says(
    text: str, fmt: str, tool_format: str, tools: Any, reason: str, cuts: list[int]
) -> None:
    pieces = cut_at(text, cuts)
    whole = _whole(text, fmt, tools, reason, tool_format=tool_format)
    assert _streamed(pieces, fmt, tools, reason, tool_format=tool_format) == whole
