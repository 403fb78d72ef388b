"""A JSON Schema ``pattern`` holding a character a JSON string writes escaped (a tab, raw or as
the regex escape ``\\t``, a line break, ``\\x01``, a ``"``, a backslash), alone or in a class:
the converter wrote it raw into the grammar's literal, so llguidance (the MLX engine's matcher)
refused the grammar ("lexer error": a 400) and llama.cpp's replies held a raw tab or quote (not
JSON). Such a character is its JSON escape in the text now, on both engines."""

from __future__ import annotations

import pytest

from scheduler.engines.grammar import response_grammar, tool_grammar
from tests.engines.test_grammar_extra_keys import llama_fits
from tests.engines.test_grammar_keywords import fits
from tests.engines.test_grammar_patterns import _schema, check_pattern

CASES: list[tuple[str, list[str], list[str]]] = [
    ("^a\tb$", ["a\tb"], ["ab", "a b"]),
    (r"^a\tb$", ["a\tb"], ["ab"]),
    (r"^[\t ]+$", ["\t \t", " "], ["a"]),
    ("^[\t ]+$", ["\t"], ["x"]),
    (r"^a\nb$", ["a\nb"], ["ab"]),
    (r"^a\x09b$", ["a\tb"], ["ab"]),
    (r"^a\u0009b$", ["a\tb"], ["ab"]),
    (r"^\t{2}$", ["\t\t"], ["\t", "\t\t\t"]),
    ("^(\t|x)+$", ["\tx\t"], ["y"]),
    (r"^a\\b$", ["a\\b"], ["a\bb", "ab"]),
    ('^a"b$', ['a"b'], ["ab"]),
    (r"^a\"b$", ['a"b'], ["ab"]),
    (r'^a["]b$', ['a"b'], ["ab"]),
    (r"^[ -~]+$", ['a"b\\c ~'], ["\t", "é"]),
    (r"^[\x00-\x7F]{1,3}$", ['\x01a"', "\x7f"], ["é"]),
    (r"^[^\t]+$", ["ab"], ["a\tb"]),
]
# JSON text no grammar for a string may let through: a raw tab, a raw quote in the string
NOT_JSON = ['{"v": "a\tb"}', '{"v": "\t"}', '{"v": "a"b"}', '{"v": "\t\t"}']


@pytest.mark.parametrize(("pattern", "good", "bad"), CASES)
def test_a_character_json_escapes_is_its_escape_on_both_engines(pattern: str, good: list[str], bad: list[str]) -> None:
    check_pattern(pattern, good, bad, NOT_JSON)


def test_a_tab_in_a_response_format_or_a_tools_parameters_compiles_for_both_engines() -> None:
    # (both as api.schemas normalises them)
    grammar = response_grammar({"type": "json_schema", "schema": _schema(r"^\d+\t\d+$")})
    assert grammar is not None
    assert fits(grammar, '{"v": "1\\t2"}') and llama_fits(grammar, '{"v": "1\\t2"}')
    assert not fits(grammar, '{"v": "12"}') and not llama_fits(grammar, '{"v": "12"}')
    tool = {"name": "f", "parameters": _schema("^a\tb$")}
    calls = tool_grammar([tool], "required", False)
    assert calls is not None
    text = '<tool_call>\n{"name": "f", "arguments": {"v": "a\\tb"}}\n</tool_call>'
    assert fits(calls, text) and llama_fits(calls, text)
