"""Llama 3.x's lazy tool grammar (``grammar.lazy_tool_grammar`` with ``fmt`` "llama3") keeps
free text from opening a call with any whitespace between the opening's tokens, as llama.cpp's
trigger pattern (``\\s*``) does. The call itself allowed one space there (its JSON's), so a
model writing the opening pretty-printed (``{\\n  "name": "``) met a dead end: the free text had
taken ``{\\n  "name": `` and refused the ``"``, and no call could take it either, so the model
was pushed into whatever else the mask left (a call that was read as a call before the grammar
came became garbage). Every opening the free text refuses is now the start of a call."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.engines.grammar import lazy_tool_grammar
from tests.engines.test_grammar_keywords import fits
from tests.engines.test_lazy_tool_grammar_own_formats_s52 import LLAMA, TOOLS, _read_alike

gaps = st.text(alphabet=" \t\n\r", max_size=4)


@settings(max_examples=150, deadline=None)
@given(gap=st.lists(gaps, min_size=9, max_size=9), typed=st.booleans(), tag=st.booleans())
def test_an_opening_with_any_whitespace_goes_on_into_the_call(gap: list[str], typed: bool, tag: bool) -> None:
    assert LLAMA is not None
    lead = f"{gap[0]}<|python_tag|>{gap[1]}" if tag else gap[0]
    head = f'"type"{gap[2]}:{gap[3]}"function"{gap[4]},{gap[5]}' if typed else ""
    text = f'{lead}{{{gap[6]}{head}"name"{gap[7]}:{gap[8]}"get_weather", "parameters": {{"city": "Rome"}}}}'
    assert fits(LLAMA, text), repr(text)
    assert _read_alike("llama3", text, TOOLS) == [("get_weather", {"city": "Rome"})]


def test_a_pretty_printed_opening_is_no_dead_end() -> None:
    grammar = lazy_tool_grammar(TOOLS, False, fmt="llama3")
    assert grammar is not None
    assert fits(grammar, '{\n  "name": "get_time", "parameters": {}}')
    assert fits(grammar, '{\n    "type": "function",\n    "name": "get_weather", "parameters": {"city": "Oslo"}}')


def test_a_name_beyond_ascii_is_written_as_it_is_or_escaped_as_in_a_forced_call() -> None:
    """The name as the forced call's JSON rules take it (``grammar._json_literal``): the call
    rule written for the opening took only the \\u escapes."""
    grammar = lazy_tool_grammar([{"name": "天気", "parameters": {"type": "object", "properties": {}}}], False, fmt="llama3")
    assert grammar is not None
    assert fits(grammar, '{"name": "天気", "parameters": {}}')
    assert fits(grammar, '{"name": "\\u5929\\u6c17", "parameters": {}}')
