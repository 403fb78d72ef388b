"""A streamed tool reply adds up to the reply unstreamed: the content is the text around the
calls stripped as a whole, so the whitespace that follows a call, when no content came before
it, is no content (``</tool_call>\\n\\nDone`` streamed the content ``"\\n\\nDone"``, where the
same reply unstreamed has ``"Done"``)."""

from __future__ import annotations

import json

import pytest

from api.responses import Reply
from scheduler.link.messages import Delta, Done
from tests.api.streamed import stream_reply

TOOLS = [{"name": "f"}, {"name": "g"}]
CALL = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'


def _message(text: str) -> dict:
    reply = Reply("chat", "m", tools=TOOLS)
    reply.add(Delta("j", text))
    return reply.body(Done("j", "stop"), None)["choices"][0]["message"]


def _streamed(pieces: list[str]) -> tuple[str | None, list[tuple[str, str]]]:
    got = stream_reply(pieces, TOOLS)
    return got.content or None, got.pairs


@pytest.mark.parametrize(
    "text",
    [CALL + "\n\nDone.", "  " + CALL + "\n Done.", CALL + "\n" + CALL.replace('"f"', '"g"') + "\n\nDone.", "Sure. " + CALL + "\n\nDone."],
)
@pytest.mark.parametrize("cut", [0, 1, 3, 7])
def test_text_after_a_call_streams_as_the_unstreamed_content(text: str, cut: int) -> None:
    whole = _message(text)
    pieces = [text] if cut == 0 else [text[i : i + cut] for i in range(0, len(text), cut)]
    content, calls = _streamed(pieces)
    assert calls == [(c["function"]["name"], c["function"]["arguments"]) for c in whole["tool_calls"]]
    assert json.dumps(content) == json.dumps(whole["content"])
