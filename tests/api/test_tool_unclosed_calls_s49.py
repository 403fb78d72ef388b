"""A reply in tool mode streams what the same reply says unstreamed (content, calls,
finish_reason), whatever its chunking (session 49).

- A call's closing that came in one delta with more than MAX_CALL_TAIL characters after it was
  sent as text (the bound counted what the delta held), where in small deltas it closed the call.
"""

from __future__ import annotations

from api.responses import MAX_CALL_TAIL
from tests.api.streamed import stream_reply, whole_reply

TOOLS = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def _both(text: str, reason: str, size: int, **reply: object) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """(streamed in pieces of ``size``, unstreamed): content, calls, finish_reason."""
    fmt = str(reply.pop("tool_format", "hermes"))
    got = stream_reply([text[i : i + size] for i in range(0, len(text), size)], TOOLS, fmt=fmt, reason=reason, **reply)
    whole = whole_reply(text, TOOLS, reason, tool_format=fmt, **reply)
    return (got.content or None, got.pairs, got.finish_reason), (whole["content"], whole["calls"], whole["finish_reason"])


def test_a_closing_in_one_delta_with_long_text_after_it_closes_the_call() -> None:
    text = CALL + " and " + "x" * (MAX_CALL_TAIL + 100)
    for size in (7, len(text)):
        streamed, whole = _both(text, "stop", size)
        assert streamed == whole == ("and " + "x" * (MAX_CALL_TAIL + 100), [("get_weather", '{"city": "Paris"}')], "tool_calls")
