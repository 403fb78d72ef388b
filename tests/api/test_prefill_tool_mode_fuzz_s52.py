"""A reply that continues a prefill keeps its leading whitespace in tool mode
(tests/edge/test_prefill_tool_mode_s52.py); streamed in any pieces it reads as it does whole, in
every tool format. A Llama 3.x call at the reply's start dropped the whitespace before it
unstreamed (its reader skipped it) while the stream sent it before the text after the call."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.api.test_tool_calls_in_order_s52 import PIECES
from tests.api.test_tool_unclosed_calls_s49 import _both

OWN_FORMS = st.sampled_from(
    ['[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}', "[TOOL_CALLS]get_weather[CALL_ID]abcdefghi[ARGS]{}", "[ARGS]",
     '{"name": "get_weather", "parameters": {"city": "Oslo"}}', "<|python_tag|>", "  ", "\t", " hi "]
)  # fmt: skip


def test_whitespace_before_a_llama3_call_then_text_reads_the_same_streamed_or_not() -> None:
    text = ' {"name": "get_weather", "parameters": {"city": "Oslo"}} and then'
    for size in (1, 3, len(text)):
        streamed, whole = _both(text, "stop", size, tool_format="llama3", continues=True)
        assert streamed == whole == ("  and then", [("get_weather", '{"city": "Oslo"}')], "tool_calls"), size


@settings(max_examples=400, deadline=None)
@given(
    parts=st.lists(st.one_of(PIECES, OWN_FORMS), max_size=10),
    fmt=st.sampled_from(["hermes", "llama3", "mistral", "qwen3_coder", "glm45"]),
    reason=st.sampled_from(["stop", "length"]),
    size=st.integers(1, 12),
    continues=st.booleans(),
)
def test_fuzz_a_continuation_streams_as_it_reads_whole(parts: list[str], fmt: str, reason: str, size: int, continues: bool) -> None:
    text = "".join(parts)
    streamed, whole = _both(text, reason, size, tool_format=fmt, continues=continues)
    assert streamed == whole, text
