"""gpt-oss's reply left unsplit (reasoning_format none, or a prefill's continuation) read as
llama-server's gpt-oss parser reads it with reasoning_format none (common/parsers/gpt-oss.cpp),
tools offered or not: the analysis is content as written, markers and all; a final or preamble
message is its text, its header no content; a call of an offered function is a call, any other
dropped. Two gaps closed here: without tools the reply came back raw, the final and preamble
headers in ``content``; and a ``<tool_call>`` block written in the analysis, the model's
reasoning, was read as a call (llama-server reads calls only from a recipient's header). The
fuzz at the end reads split replies too, and calls' markup in a final or preamble message
(tests/api/test_harmony_calls_recipients_s53.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.reasoning import HARMONY_UNSPLIT
from api.responses import Reply
from scheduler.link.messages import Delta, Done
from tests.api.streamed import CUTS, assemble, cut_at, streamed_chunks, whole_view
from tests.api.test_harmony_unsplit_s52 import ANALYSIS, CALL, FINAL, PREAMBLE, TOOLS

CALLED = [("get_weather", '{"city":"Paris"}')]
# a call written in the analysis's text, as the generic block and as Qwen3-Coder's tags
GENERIC = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
CODER = "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>"


def _reply(tools: Any, kw: dict[str, Any]) -> Reply:
    return Reply("chat", "m", tools=tools, **{"reasoning_format": HARMONY_UNSPLIT, **kw})


def whole(text: str, tools: Any = None, reason: str = "stop", **kw: Any) -> dict[str, Any]:
    reply = _reply(tools, kw)
    reply.add(Delta("j", text))
    return whole_view(reply.body(Done("j", reason), None)["choices"][0])


def streamed(pieces: list[str], tools: Any = None, reason: str = "stop", **kw: Any) -> dict[str, Any]:
    reply = _reply(tools, kw)
    return assemble(reply.first_chunks() + streamed_chunks(reply, pieces, reason)).view()


def both(text: str, tools: Any = None, **kw: Any) -> dict[str, Any]:
    """The unstreamed reply's view, once the reply streamed a character at a time says the same."""
    got = whole(text, tools, **kw)
    assert streamed(list(text), tools, **kw) == got
    return got


@pytest.mark.parametrize(
    ("text", "content"),
    [
        (ANALYSIS + FINAL, ANALYSIS + "It is sunny."),
        (ANALYSIS + PREAMBLE + FINAL, ANALYSIS + "Checking the forecast.It is sunny."),
        (FINAL[len("<|start|>assistant") :], "It is sunny."),  # a final message first
        # the commentary gpt-oss-20b writes at times before a channel: kept in the analysis, as
        # llama-server's stray_commentary is inside its content; no content before a final's text
        (
            "<|channel|>commentary to=assistant<|channel|>analysis<|message|>Hm.<|end|>"
            "<|start|>assistant<|channel|>commentary to=assistant<|channel|>final<|message|>Hi.",
            "<|channel|>commentary to=assistant<|channel|>analysis<|message|>Hm.<|end|>Hi.",
        ),
        # a call nobody offered tools for (llama-server's "unsolicited"): dropped
        (ANALYSIS + CALL, ANALYSIS),
        (ANALYSIS + "<|start|>assistant<|channel|>commentary to=browser.open <|constrain|>json<|message|>{}", ANALYSIS),
    ],
)
def test_without_tools_the_headers_are_no_content_as_llama_server_reads_it(text: str, content: str) -> None:
    assert both(text) == {"reasoning": None, "content": content, "calls": [], "finish_reason": "stop"}
    # tool_choice none: no call is read, as without tools
    assert both(text, TOOLS, tool_choice="none")["content"] == content


def test_without_tools_a_prefills_continuation_is_its_text_up_to_the_next_header() -> None:
    # a prefill "<|channel|>analysis<|message|>The user wants" continued, then the final message
    got = both(" the weather.<|end|>" + FINAL, continues=True)
    assert got == {"reasoning": None, "content": " the weather.<|end|>It is sunny.", "calls": [], "finish_reason": "stop"}
    assert both(" Paris.", continues=True)["content"] == " Paris."


@pytest.mark.parametrize(("written", "tool_format"), [(GENERIC, "hermes"), (CODER, "qwen3_coder")])
@pytest.mark.parametrize("then", ["", FINAL, CALL])
def test_a_call_written_in_the_analysis_is_its_text_not_a_call(written: str, tool_format: str, then: str) -> None:
    analysis = f"<|channel|>analysis<|message|>I could write {written} but I should not.<|end|>"
    got = both(analysis + then, TOOLS, tool_format=tool_format)
    calls = CALLED if then == CALL else []
    content = analysis + ("It is sunny." if then == FINAL else "")
    assert got == {"reasoning": None, "content": content, "calls": calls, "finish_reason": "tool_calls" if calls else "stop"}


def test_a_call_written_in_a_prefilled_analysis_is_its_text_not_a_call() -> None:
    got = both(f" weather: {GENERIC}<|end|>" + CALL, TOOLS, continues=True)
    assert got == {"reasoning": None, "content": f" weather: {GENERIC}<|end|>", "calls": CALLED, "finish_reason": "tool_calls"}


def test_a_call_cut_open_before_an_analysis_stays_cut_and_the_analysis_is_content() -> None:
    # arguments that never close (no JSON: the string runs on through the closing written at
    # the message's end) before the next message: the call is cut there, as at the reply's end
    # (finish stop, not tool_calls), and the analysis after it is content, no more arguments
    got = both('<|channel|>commentary to=functions.get_weather<|message|>{"city": "P<|end|>' + ANALYSIS + FINAL, TOOLS)
    assert got["calls"] == [("get_weather", '{"city": "P}</tool_call>')]
    assert got["finish_reason"] == "stop"
    assert got["content"] == ANALYSIS + "It is sunny."


# a call written in a message's text in Mistral's format
MISTRAL = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]'
# text of a message's body, in any channel: no marker that ends it, but the tool formats' markup
# in any order, whole calls among it (session 53: in a final or preamble message they were read
# as calls, llama-server reads none there)
BODY = [
    GENERIC, CODER, MISTRAL, "[TOOL_CALLS]", "[ARGS]",
    "<tool_call>", "</tool_call>", "<tool_call>\n", '{"name": "get_weather", "arguments": ', '{"name": "f", "arguments": ',
    '{"city": "P"}', "{}", "{", "}", '"', "<function=get_weather>", "<parameter=city>", "</parameter>", "</function>",
    "<|", "|>", "<|constrain|>", " ", "\n", "x", "é",
]  # fmt: skip
body = st.lists(st.sampled_from(BODY), max_size=10).map("".join)
messages = st.lists(st.tuples(st.sampled_from(["analysis", "commentary", "final"]), body), max_size=4)


def _splits(text: str, cuts: list[int]) -> list[str]:
    return cut_at(text, cuts)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    said=messages,
    call=st.booleans(),
    split=st.booleans(),
    tools=st.sampled_from([None, TOOLS]),
    tool_choice=st.sampled_from(["auto", "required", "none"]),
    tool_format=st.sampled_from(["hermes", "qwen3_coder", "mistral"]),
    cuts=CUTS,
)
def test_any_gpt_oss_reply_is_content_as_llama_server_gives_it_and_its_calls_only_the_recipients(
    said: list[tuple[str, str]], call: bool, split: bool, tools: Any, tool_choice: str, tool_format: str, cuts: list[int]
) -> None:
    """Messages of any text, calls' markup in it: unsplit, the content is each analysis as
    written and each other message's text, headers dropped; split (reasoning_format auto), the
    analyses are the reasoning and the other messages' text the content. The only call is the
    one in a recipient's header, and only where tools are offered (tool_choice not none);
    streamed in any split, the same."""
    text = "".join(f"<|start|>assistant<|channel|>{channel}<|message|>{body}<|end|>" for channel, body in said)
    text = text[len("<|start|>assistant") :] + (CALL if call else "")
    kw: dict[str, Any] = {"tool_format": tool_format, "tool_choice": tool_choice}
    if split:
        kw["reasoning_format"] = "harmony"
        expected = "".join(body for channel, body in said if channel != "analysis")
        reasoning = "".join(body for channel, body in said if channel == "analysis").strip() or None
    else:
        expected = "".join(f"<|channel|>analysis<|message|>{body}<|end|>" if channel == "analysis" else body for channel, body in said)
        reasoning = None
    got = whole(text, tools, **kw)
    assert streamed(_splits(text, cuts), tools, **kw) == got
    offered = bool(tools) and tool_choice != "none"
    calls = CALLED if call and offered else []
    stripped = expected.strip() if calls else expected.lstrip()  # (tool mode: the content's edges as with any calls)
    assert got == {
        "reasoning": reasoning,
        "content": (stripped if offered else expected) or None,
        "calls": calls,
        "finish_reason": "tool_calls" if calls else "stop",
    }
