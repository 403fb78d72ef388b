"""gpt-oss's calls read where its reply is not split (tests/edge/inproc.py, the scripted engine
with gpt-oss's chat template): the request's reasoning_format none and an assistant prefill,
with tools offered, give the call as a call and the rest as content, as llama-server's gpt-oss
parser gives them with reasoning_format none; streamed and unstreamed alike; without tools the
same, the final message's header no content. The middle layer's part: api/consumers.py's
reply_reasoning picks the harmony reader for such a reply. A ``<tool_call>`` block written in a
message's text is no call, split or not (session 53)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.streamed import said

from .templated import engine_of, loop_fixture
from .test_assistant_prefill_inproc_s52 import chat
from .test_stream_equivalence import script

pytestmark = pytest.mark.django_db(transaction=True)

gpt_oss = loop_fixture("gpt_oss", engine_of("gpt-oss-120b.jinja"))
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather in Paris.<|end|>"
CALL = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}'
CALLED = [("get_weather", '{"city":"Paris"}')]


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_format_none_keeps_the_analysis_as_content_and_reads_the_call(gpt_oss: Any, stream: bool) -> None:
    messages = [{"role": "user", "content": "Weather in Paris? " + script(ANALYSIS + CALL)}]
    view = said(chat(gpt_oss, messages, tools=TOOLS, reasoning_format="none", stream=stream), stream)
    assert view == {"reasoning": None, "content": ANALYSIS, "calls": CALLED, "finish_reason": "tool_calls"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_prefilled_analysis_continued_into_a_call_is_a_call(gpt_oss: Any, stream: bool) -> None:
    written = " in Paris. Call get_weather.<|end|>" + CALL
    messages = [{"role": "user", "content": "Weather? " + script(written)}, {"role": "assistant", "content": "<|channel|>analysis<|message|>The user wants the weather"}]
    view = said(chat(gpt_oss, messages, tools=TOOLS, stream=stream), stream)
    assert view == {"reasoning": None, "content": " in Paris. Call get_weather.<|end|>", "calls": CALLED, "finish_reason": "tool_calls"}


@pytest.mark.parametrize("stream", [False, True])
def test_without_tools_an_unsplit_reply_keeps_its_analysis_and_drops_the_final_header(gpt_oss: Any, stream: bool) -> None:
    # as llama-server's gpt-oss parser with reasoning_format none (session 53: before, the reply
    # came back as it came, the final message's header in the content)
    written = ANALYSIS + "<|start|>assistant<|channel|>final<|message|>Sunny."
    view = said(chat(gpt_oss, [{"role": "user", "content": "Weather? " + script(written)}], reasoning_format="none", stream=stream), stream)
    assert view == {"reasoning": None, "content": ANALYSIS + "Sunny.", "calls": [], "finish_reason": "stop"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_block_written_in_the_analysis_is_content_not_a_call(gpt_oss: Any, stream: bool) -> None:
    analysis = '<|channel|>analysis<|message|>Maybe <tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>? No.<|end|>'
    messages = [{"role": "user", "content": "Weather in Paris? " + script(analysis + CALL)}]
    view = said(chat(gpt_oss, messages, tools=TOOLS, reasoning_format="none", stream=stream), stream)
    assert view == {"reasoning": None, "content": analysis, "calls": CALLED, "finish_reason": "tool_calls"}


@pytest.mark.parametrize("stream", [False, True])
def test_without_tools_a_prefilled_reply_drops_the_final_header(gpt_oss: Any, stream: bool) -> None:
    written = " in Paris.<|end|><|start|>assistant<|channel|>final<|message|>Sunny."
    messages = [{"role": "user", "content": "Weather? " + script(written)}, {"role": "assistant", "content": "<|channel|>analysis<|message|>The user wants the weather"}]
    view = said(chat(gpt_oss, messages, stream=stream), stream)
    assert view == {"reasoning": None, "content": " in Paris.<|end|>Sunny.", "calls": [], "finish_reason": "stop"}


@pytest.mark.parametrize("reasoning_format", [None, "none"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_call_block_written_in_a_preamble_is_content_not_a_call(gpt_oss: Any, stream: bool, reasoning_format: str | None) -> None:
    # llama-server reads gpt-oss's calls only from a recipient's header, split or not (session
    # 53: a <tool_call> block in a final or preamble message was read as a call)
    text = 'I will not run <tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>.'
    preamble = f"<|start|>assistant<|channel|>commentary<|message|>{text}<|end|>"
    messages = [{"role": "user", "content": "Weather in Paris? " + script(ANALYSIS + preamble + CALL)}]
    extra = {} if reasoning_format is None else {"reasoning_format": reasoning_format}
    view = said(chat(gpt_oss, messages, tools=TOOLS, stream=stream, **extra), stream)
    if reasoning_format is None:  # split: the analysis is the reasoning
        assert view == {"reasoning": "The user wants the weather in Paris.", "content": text, "calls": CALLED, "finish_reason": "tool_calls"}
    else:
        assert view == {"reasoning": None, "content": ANALYSIS + text, "calls": CALLED, "finish_reason": "tool_calls"}
