"""A prefilled reply with tools offered (tests/edge/inproc.py, the scripted engine with a
model's chat template): the continuation's leading whitespace is the reply's own text. Tool
mode strips the content's leading whitespace (a reply with calls has the text around them
stripped), which for a reply that continues the client's text glued it to the prefill:
Anthropic's rule (a prefill may not end with white space) makes the model write that space,
and Claude Code offers tools with every request, so "The capital is" came back as
"The capital isParis."."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.streamed import said

from .inproc import MODEL
from .test_assistant_prefill_inproc_s52 import anthropic_text, chat, chatml, post  # noqa: F401 - chatml: a fixture
from .test_stream_equivalence import script

pytestmark = pytest.mark.django_db(transaction=True)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("written", "content", "calls"),
    [
        (" Paris.", " Paris.", 0),  # the continuation as written, its space included
        ("\n\n- Paris\n", "\n\n- Paris\n", 0),  # no call: the whole text, as without tools
        (" Paris. " + CALL, " Paris.", 1),  # with a call: the text around it, its end stripped
        ("  " + CALL, None, 1),  # a call alone: no content
    ],
)
def test_a_prefilled_reply_with_tools_keeps_its_leading_whitespace(chatml: Any, stream: bool, written: str, content: str | None, calls: int) -> None:  # noqa: F811
    messages = [{"role": "user", "content": "Where? " + script(written)}, {"role": "assistant", "content": "The capital is"}]
    view = said(chat(chatml, messages, tools=TOOLS, stream=stream), stream)
    assert view["content"] == content
    assert len(view["calls"]) == calls


@pytest.mark.parametrize("stream", [False, True])
def test_an_anthropic_prefill_with_tools_keeps_the_space_the_model_writes(chatml: Any, stream: bool) -> None:  # noqa: F811
    body = {"model": MODEL, "max_tokens": 50, "stream": stream, "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "Where? " + script(" Paris.")}, {"role": "assistant", "content": "The capital is"}]}  # fmt: skip
    assert anthropic_text(post(chatml, "/v1/messages", body), stream) == " Paris."


@pytest.mark.parametrize("stream", [False, True])
def test_without_a_prefill_tool_mode_still_strips_the_leading_whitespace(chatml: Any, stream: bool) -> None:  # noqa: F811
    view = said(chat(chatml, [{"role": "user", "content": "Where? " + script(" Paris.")}], tools=TOOLS, stream=stream), stream)
    assert view["content"] == "Paris."
