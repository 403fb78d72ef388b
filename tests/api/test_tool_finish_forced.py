"""A forced tool call completed by the last token ``max_tokens`` allowed."""

from __future__ import annotations

from typing import Any

import pytest

from api.responses import Reply
from scheduler.link.messages import Delta, Done

TOOLS = [{"name": "f"}, {"name": "g"}]
CALL = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'


def _unstreamed(text: str, reason: str, **kw: Any) -> dict[str, Any]:
    reply = Reply("chat", "m", tools=TOOLS, **kw)
    reply.add(Delta("j", text))
    return reply.body(Done("j", reason), None)["choices"][0]


def _streamed_reason(text: str, reason: str, cut: int, **kw: Any) -> str:
    reply = Reply("chat", "m", tools=TOOLS, **kw)
    chunks = [c for i in range(0, len(text), cut) for c in reply.delta_chunks(Delta("j", text[i : i + cut]))]
    chunks += reply.final_chunks(Done("j", reason), None)
    reasons = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert len(reasons) == 1
    return reasons[0]


@pytest.mark.parametrize(
    ("kw", "text"),
    [
        ({"tool_choice": {"name": "f"}}, CALL),
        ({"tool_choice": "required", "parallel_tool_calls": False}, CALL),
        ({"tool_choice": "required"}, "\n".join([CALL] * 4)),
        ({"tool_choice": {"name": "f"}, "legacy_functions": True}, CALL),
    ],
)
@pytest.mark.parametrize("cut", [1, 5, 1000])
def test_a_forced_call_that_its_grammar_ends_finishes_tool_calls_though_max_tokens_ended_it(kw: dict[str, Any], text: str, cut: int) -> None:
    """The grammar of a forced call allows nothing after the call (only the end of
    generation), so a reply whose last call closed with the max_tokens-th token is whole: its
    calls parse and are sent, and OpenAI says ``tool_calls``, not ``length``."""
    expected = "function_call" if kw.get("legacy_functions") else "tool_calls"
    choice = _unstreamed(text, "length", **kw)
    assert choice["finish_reason"] == expected
    assert _streamed_reason(text, "length", cut, **kw) == expected


@pytest.mark.parametrize(
    ("kw", "text"),
    [
        ({"tool_choice": "auto"}, CALL),  # the model might have gone on
        ({"tool_choice": "required"}, CALL),  # up to 4 parallel calls: more might have come
        ({"tool_choice": {"name": "f"}}, CALL[:-3]),  # the closing was cut
        ({"tool_choice": {"name": "f"}}, CALL[:30]),  # the arguments were cut
    ],
)
def test_a_reply_max_tokens_cut_or_that_could_go_on_still_finishes_length(kw: dict[str, Any], text: str) -> None:
    assert _unstreamed(text, "length", **kw)["finish_reason"] == "length"
    assert _streamed_reason(text, "length", 3, **kw) == "length"
