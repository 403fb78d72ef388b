"""Non-ASCII text a schema fixes (an ``enum``'s or a ``const``'s value, a property's name, a tool's
name) may be written as it is, as llama-server's converter and OpenAI write it: the converter
allowed only its ``\\uXXXX`` escapes, so every reply showed ``"\\u662f"`` for ``"是"``, and
every non-ASCII choice of an enum began with the same ``"\\u``, the model choosing between
them on hex digits. The escaped form still fits (it is the same JSON)."""

from __future__ import annotations

import json

from scheduler.engines.grammar import check_bounds, schema_grammar, tool_grammar
from tests.engines.test_grammar_extra_keys import llama_fits
from tests.engines.test_grammar_keywords import fits


def _both(grammar: str, text: str) -> bool:
    return fits(grammar, text) and llama_fits(grammar, text)


def test_an_enums_non_ascii_values_may_be_written_as_they_are() -> None:
    grammar = schema_grammar({"type": "object", "properties": {"answer": {"enum": ["是", "否", "maybe", "café 😀"]}},
                              "required": ["answer"], "additionalProperties": False})
    check_bounds(grammar)
    for value in ("是", "否", "maybe", "café 😀"):
        assert _both(grammar, json.dumps({"answer": value}, ensure_ascii=False)), value
        assert _both(grammar, json.dumps({"answer": value})), value
    assert not _both(grammar, json.dumps({"answer": "不"}, ensure_ascii=False))


def test_a_consts_and_a_property_names_non_ascii_text_may_be_written_as_it_is() -> None:
    grammar = schema_grammar({"type": "object", "properties": {"ville": {"const": "Genève"}, "prénom": {"type": "string"}},
                              "required": ["ville", "prénom"], "additionalProperties": False})
    value = {"ville": "Genève", "prénom": "Zoë"}
    assert _both(grammar, json.dumps(value, ensure_ascii=False))
    assert _both(grammar, json.dumps(value))
    assert not _both(grammar, json.dumps({"ville": "Geneve", "prénom": "Zoë"}, ensure_ascii=False))


def test_a_non_ascii_tool_name_may_be_written_as_it_is() -> None:
    tool = {"name": "天気", "parameters": {"type": "object", "properties": {}}}
    grammar = tool_grammar([tool], "required", False)
    assert grammar is not None
    assert _both(grammar, '<tool_call>\n{"name": "天気", "arguments": {}}\n</tool_call>')


def test_a_lone_surrogate_stays_escaped() -> None:
    """JSON's ``"\\ud800"`` is a Python string no UTF-8 can hold: only its escape is written."""
    grammar = schema_grammar({"enum": ["\ud800x"]})
    grammar.encode("utf-8")
    assert fits(grammar, '"\\ud800x"')


def test_a_character_beyond_the_bmp_counts_once_however_it_is_written() -> None:
    """JSON writes 😀 (U+1F600, one character) raw or as the surrogate pair ``"\\ud83d\\ude00"``;
    the grammar counted the escaped form as 2 characters for ``minLength``/``maxLength``, the raw
    one as 1: a string at ``maxLength`` was refused, and one 1 under ``minLength`` allowed."""
    at_most_one = schema_grammar({"type": "string", "maxLength": 1})
    at_least_two = schema_grammar({"type": "string", "minLength": 2})
    for text in ('"😀"', '"\\ud83d\\ude00"'):
        assert _both(at_most_one, text), text
        assert not fits(at_least_two, text) and not llama_fits(at_least_two, text), text
    assert _both(at_least_two, '"\\ud83d\\ude00x"')
    assert _both(at_most_one, '"\\u00e9"')
    # a lone surrogate is no character (its pair's halves, one by one, counted 2)
    assert not fits(at_least_two, '"\\ud83d\\ude00"') and not fits(at_least_two, '"\\ude00\\ud83d"')
