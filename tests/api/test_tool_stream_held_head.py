"""Text held as a possible tool call's head is matched against the head's pattern with each
delta; a head is short (a name of at most 64 characters, written with escapes at most six
each), so the text that never becomes one (an unclosed name string the model goes on writing,
or whitespace) must cost a bounded match per delta, not a scan of everything held: 16,000 such
tokens took 20 s of the web process's event loop, every other request stalled behind it."""

from __future__ import annotations

import re
import sys

import pytest

from api import responses
from api.responses import Reply
from scheduler.link.messages import Delta, Done

TOOLS = [{"name": "f"}]


class _Scanned:
    """The head's pattern, counting the characters each match may scan (its window)."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern
        self.windows: list[int] = []

    def match(self, text: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        self.windows.append(min(len(text), endpos) - pos)
        return self.pattern.match(text, pos, endpos)


@pytest.mark.parametrize(("head", "piece"), [('<tool_call>{"name": "', "abcd"), ("<tool_call>", "  \n ")])
def test_text_that_never_becomes_a_head_costs_a_bounded_match_per_delta(head: str, piece: str, monkeypatch: pytest.MonkeyPatch) -> None:
    scanned = _Scanned(responses._CALL_HEAD)
    monkeypatch.setattr(responses, "_CALL_HEAD", scanned)
    reply = Reply("chat", "m", tools=TOOLS)
    reply.delta_chunks(Delta("j", head))
    for _ in range(16000):
        assert reply.delta_chunks(Delta("j", piece)) == []  # held: it may still be a call
    # each delta's match looks at a bounded window, not at everything held (64,000 characters)
    assert scanned.windows and max(scanned.windows) <= responses.MAX_CALL_HEAD
    monkeypatch.undo()
    frames = reply.final_chunks(Done("j", "length"), None)
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in frames)
    whole = Reply("chat", "m", tools=TOOLS)
    whole.add(Delta("j", head + piece * 16000))
    assert content == whole.body(Done("j", "length"), None)["choices"][0]["message"]["content"]  # the text, as unstreamed


def test_a_head_with_an_escaped_name_still_streams_at_once() -> None:
    reply = Reply("chat", "m", tools=[{"name": "f" * 64}])
    name = "".join("\\u0066" for _ in range(64))
    frames = reply.delta_chunks(Delta("j", '<tool_call>\n  {\n    "name": "' + name + '",\n    "arguments": {'))
    calls = [tc for c in frames for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "f" * 64
