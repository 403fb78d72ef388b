"""A streamed tool call whose arguments went out whole, cut (by ``max_tokens``, a stop string or
the end of generation) inside its block's closing (``}`` ``</tool_call>``): the client gets the
call and the finish reason, and none of the cut closing's markup as ``content``.

Seen: a forced call (``tool_choice`` a named function) cut by ``max_tokens`` two characters
before ``</tool_call>`` ended its stream with a content delta ``"}\\n</tool_c"`` after the call's
arguments; a client appending content deltas showed the user raw markup beside the call."""

from __future__ import annotations

from typing import Any

import pytest

from api.responses import Reply
from scheduler.link.messages import Delta, Done

TOOLS = [{"name": "f"}, {"name": "g"}]
CALL = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
ARGS_END = CALL.index("}}") + 1  # the arguments' closing brace


def streamed(text: str, reason: str, cut: int, **kw: Any) -> tuple[str | None, list[dict[str, Any]], str]:
    """(the content the deltas add up to, the calls, the finish reason) as a client reassembles them."""
    reply = Reply("chat", "m", tools=TOOLS, **kw)
    chunks = [c for i in range(0, len(text), cut) for c in reply.delta_chunks(Delta("j", text[i : i + cut]))]
    chunks += reply.final_chunks(Done("j", reason), None)
    content: str | None = None
    calls: dict[int, dict[str, Any]] = {}
    reasons = []
    for chunk in chunks:
        (choice,) = chunk["choices"]
        delta = choice["delta"]
        if delta.get("content"):
            content = (content or "") + delta["content"]
        for call in delta.get("tool_calls") or []:
            got = calls.setdefault(call["index"], {"name": "", "arguments": ""})
            got["name"] += call.get("function", {}).get("name", "")
            got["arguments"] += call.get("function", {}).get("arguments", "")
        if choice["finish_reason"]:
            reasons.append(choice["finish_reason"])
    (finish,) = reasons
    return content, list(calls.values()), finish


@pytest.mark.parametrize("end", range(ARGS_END + 1, len(CALL)))
@pytest.mark.parametrize("cut", [1, 4, 1000])
@pytest.mark.parametrize("kw", [{"tool_choice": {"name": "f"}}, {"tool_choice": "required", "parallel_tool_calls": False}, {"tool_choice": "auto"}])
def test_a_call_cut_inside_its_closing_sends_no_markup_as_content(end: int, cut: int, kw: dict[str, Any]) -> None:
    content, calls, finish = streamed(CALL[:end], "length", cut, **kw)
    assert content is None, (CALL[:end], content)
    assert calls == [{"name": "f", "arguments": '{"a": 1}'}]
    assert finish == "length"  # cut: as OpenAI finishes a call max_tokens cut


@pytest.mark.parametrize("end", range(ARGS_END + 1, len(CALL)))
def test_the_end_of_generation_inside_the_closing_sends_no_markup_either(end: int) -> None:
    content, calls, finish = streamed(CALL[:end], "stop", 3, tool_choice="auto")
    assert content is None and calls == [{"name": "f", "arguments": '{"a": 1}'}] and finish == "stop"


def test_text_after_a_closing_that_is_no_closing_is_still_content() -> None:
    content, calls, _ = streamed(CALL[:ARGS_END] + "} and then prose", "stop", 3, tool_choice="auto")
    assert calls == [{"name": "f", "arguments": '{"a": 1}'}] and content == "} and then prose"
