"""gpt-oss's calls come only from a recipient's header (``to=functions.NAME``), as llama-server's
gpt-oss parser reads them (common/parsers/gpt-oss.cpp): a ``<tool_call>`` block, Qwen3-Coder's
tags or Mistral's ``[TOOL_CALLS]`` written in a final or preamble message is that message's
text, split (reasoning_format auto) or not, streamed or not. Before, the answer's text went
through the generic call reader: such a block was read as a call (its arguments held to no
schema: tool_choice auto's grammar leaves a message's text free), and streamed, the text from
its opening on was held back until the reply's end. A reply that opens no message, as a forced
call's grammar writes it (the generic block from the first token), is still read as before."""

from __future__ import annotations

from typing import Any

import pytest

from api.reasoning import HARMONY_UNSPLIT
from api.responses import Reply
from scheduler.link.messages import Delta, Done
from tests.api.streamed import assemble, streamed_chunks, whole_view
from tests.api.test_harmony_unsplit_s52 import ANALYSIS, CALL, TOOLS
from tests.api.test_harmony_unsplit_s53 import CALLED, CODER, GENERIC, MISTRAL

WRITTEN = [(GENERIC, "hermes"), (CODER, "qwen3_coder"), (MISTRAL, "mistral")]
FORMATS = ["harmony", HARMONY_UNSPLIT]


def _reply(fmt: str, tool_format: str, **kw: Any) -> Reply:
    return Reply("chat", "m", tools=TOOLS, reasoning_format=fmt, tool_format=tool_format, **kw)


def both(text: str, fmt: str, tool_format: str, reason: str = "stop", **kw: Any) -> dict[str, Any]:
    """The unstreamed reply's view, once the reply streamed a character at a time says the same."""
    reply = _reply(fmt, tool_format, **kw)
    reply.add(Delta("j", text))
    got = whole_view(reply.body(Done("j", reason), None)["choices"][0])
    reply = _reply(fmt, tool_format, **kw)
    assert assemble(reply.first_chunks() + streamed_chunks(reply, list(text), reason)).view() == got
    return got


@pytest.mark.parametrize(("written", "tool_format"), WRITTEN)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channel", ["final", "commentary"])
@pytest.mark.parametrize("then", ["", CALL])
def test_a_call_written_in_a_final_or_preamble_message_is_its_text(written: str, tool_format: str, fmt: str, channel: str, then: str) -> None:
    said = f"I would write {written} here."
    message = f"<|start|>assistant<|channel|>{channel}<|message|>{said}" + ("<|end|>" if then else "")
    got = both(ANALYSIS + message + then, fmt, tool_format)
    calls = CALLED if then else []
    assert got["calls"] == calls
    assert got["finish_reason"] == ("tool_calls" if calls else "stop")
    assert got["content"] == (said if fmt == "harmony" else ANALYSIS + said)


@pytest.mark.parametrize(
    ("tool_format", "opening"), [("hermes", "<tool_call>"), ("qwen3_coder", "<tool_call>\n<function="), ("mistral", "[TOOL_CALLS]")]
)
def test_a_calls_opening_in_the_final_message_streams_as_it_comes_not_held(tool_format: str, opening: str) -> None:
    reply = _reply("harmony", tool_format)
    text = ANALYSIS + "<|start|>assistant<|channel|>final<|message|>Write " + opening
    frames = reply.first_chunks() + [frame for ch in text for frame in reply.delta_chunks(Delta("j", ch))]
    # the reply has not ended: the content is all there already
    assert assemble(frames).content == "Write " + opening


def test_a_call_in_the_final_message_against_its_schema_is_no_call() -> None:
    # tool_choice auto's grammar holds only a recipient's call to the tools' parameters: this
    # text it leaves free was read as a call with arguments no schema allows
    block = '<tool_call>{"name": "get_weather", "arguments": {"city": 5}}</tool_call>'
    got = both(ANALYSIS + "<|start|>assistant<|channel|>final<|message|>" + block, "harmony", "hermes")
    assert got == {"reasoning": "The user wants the weather in Paris. Call get_weather.", "content": block, "calls": [], "finish_reason": "stop"}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}, "auto"])
def test_a_reply_that_opens_no_message_is_read_as_before(fmt: str, tool_choice: Any) -> None:
    """A forced call's grammar (and the grammar of tools beside a response_format) writes the
    generic block from the first token: no harmony message, the block a call as it was."""
    got = both(GENERIC, fmt, "hermes", tool_choice=tool_choice)
    assert got == {"reasoning": None, "content": None, "calls": [("get_weather", '{"city": "Rome"}')], "finish_reason": "tool_calls"}
    # its opening cut by max_tokens: markup of the grammar, no content
    assert both("<", fmt, "hermes", reason="length", tool_choice="required")["content"] is None


def test_text_after_a_message_that_is_no_header_after_all_is_no_call() -> None:
    # past the most a header takes, the text is answer as it came; after a message it is no
    # reply that a forced call's grammar wrote: no call in it
    text = ANALYSIS + "<|start|>assistant" + " " * 520 + GENERIC
    got = both(text, "harmony", "hermes")
    assert got["calls"] == [] and got["content"] == "<|start|>assistant" + " " * 520 + GENERIC
