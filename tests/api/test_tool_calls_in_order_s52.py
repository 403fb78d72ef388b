"""A reply of a model with its own call format (Qwen3-Coder's and GLM's tags, Mistral's
``[TOOL_CALLS]``) that writes a JSON ``<tool_call>`` block before a call in its own format reads
the same unstreamed as streamed (session 52).

The stream reads the reply in order: a JSON block whose head names an offered function is a call
streamed at once, and the text from where a call in the model's own format begins is held and read
in that format at the end. Unstreamed, the whole reply was read in the model's format first, and
the JSON blocks before its first call came back as the content's text (``<tool_call>{"name": ...``
shown to the user as the reply) while the stream had made them calls."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.api.test_tool_unclosed_calls_s49 import _both

JSON_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
OWN = {
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>",
    "glm45": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n</tool_call>",
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]',
}
PARIS, ROME = ("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')


def test_a_json_call_then_one_in_the_models_format_are_two_calls_streamed_or_not() -> None:
    for fmt, own in OWN.items():
        text = JSON_CALL + " ok " + own
        for size in (1, 5, len(text)):
            streamed, whole = _both(text, "stop", size, tool_format=fmt)
            assert streamed == whole == ("ok", [PARIS, ROME], "tool_calls"), (fmt, size)


def test_a_json_call_cut_open_before_one_in_the_models_format_holds_it_in_its_arguments() -> None:
    # the JSON string never closed: what follows is its arguments' text as the model wrote it
    # (the stream sent it so), not a second call
    for fmt, own in OWN.items():
        text = '<tool_call>{"name": "get_weather", "arguments": {"city": "P' + own
        streamed, whole = _both(text, "stop", 4, tool_format=fmt)
        assert streamed == whole, fmt
        assert whole[1] == [("get_weather", '{"city": "P' + own)], fmt


def test_a_call_in_the_models_format_first_still_makes_a_later_json_block_text() -> None:
    # once a call in the model's own format began, the rest is read in that format (as before)
    for fmt, own in OWN.items():
        text = own + JSON_CALL
        streamed, whole = _both(text, "stop", 3, tool_format=fmt)
        assert streamed == whole, fmt
        assert whole[1] == [ROME], fmt


PIECES = st.sampled_from(
    [JSON_CALL, '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa', "}", "</tool_call>", " ", "\n",
     "Sure.", "<tool_call>", "<function=get_weather>", "<parameter=city>", "Rome", "</parameter>", "</function>",
     "get_weather", "<arg_key>", "city", "</arg_key>", "<arg_value>", "</arg_value>", "[TOOL_CALLS]",
     '[{"name": "get_weather", "arguments": {"city": "Rome"}}]', *OWN.values()]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(PIECES, max_size=10),
    fmt=st.sampled_from(sorted(OWN)),
    reason=st.sampled_from(["stop", "length"]),
    size=st.integers(1, 12),
)
def test_fuzz_json_and_own_format_blocks_in_any_order_stream_as_they_read_whole(parts: list[str], fmt: str, reason: str, size: int) -> None:
    text = "".join(parts)
    streamed, whole = _both(text, reason, size, tool_format=fmt)
    assert streamed == whole, text
