"""MLX structured output: a recursive alternative beside a flat one that starts with the same
character. llguidance's ``gbnf_to_lark`` turned the flat one into a single lexeme (``{"x":...}``)
that competed with the recursive rule's ``"{"`` lexeme, and llguidance's lexer, greedy and
without backtracking, took the longer one and then failed: ``{"v":1,"kids":[]}`` never fitted.
llama.cpp's grammar sampler, over the same GBNF, allows it."""

from __future__ import annotations

import json

from scheduler.engines.grammar import schema_grammar, tool_grammar
from tests.engines.test_grammar_keywords import fits

NODE = {
    "type": "object",
    "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
    "required": ["v", "kids"],
    "additionalProperties": False,
}
FLAT = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"], "additionalProperties": False}


def test_a_recursive_alternative_beside_a_flat_object_fits() -> None:
    grammar = schema_grammar({"$defs": {"Node": NODE}, "anyOf": [{"$ref": "#/$defs/Node"}, FLAT]})
    for text in ['{"v":1,"kids":[]}', '{"v":1,"kids":[{"v":2,"kids":[]}]}', '{"x":"a"}']:
        assert fits(grammar, text), text
    for text in ['{"x":1}', '{"v":1}', '{"v":1,"kids":[{"x":"a"}]}']:
        assert not fits(grammar, text), text


def test_tool_choice_required_can_call_the_recursive_tool_beside_a_flat_one() -> None:
    tools = [
        {"name": "tree", "description": "", "parameters": {"$defs": {"Node": NODE}, "$ref": "#/$defs/Node"}},
        {"name": "flat", "description": "", "parameters": FLAT},
    ]
    grammar = tool_grammar(tools, "required", False)
    assert grammar is not None
    tree = {"name": "tree", "arguments": {"v": 1, "kids": [{"v": 2, "kids": []}]}}
    flat = {"name": "flat", "arguments": {"x": "a"}}
    for call in (tree, flat):
        assert fits(grammar, "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"), call


def test_a_client_grammar_whose_literals_share_a_prefix_fits_as_on_llama_cpp() -> None:
    """``"ab" | "a" "bc"``: the lexer took ``ab`` whole, then had no way to read ``c``."""
    grammar = 'root ::= "ab" | "a" "bc"\n'
    assert fits(grammar, "ab")
    assert fits(grammar, "abc")
    assert not fits(grammar, "abd")


def test_an_additional_property_sharing_a_declared_keys_prefix_fits_in_a_recursive_object() -> None:
    node = {
        "type": "object",
        "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}},
        "additionalProperties": {"type": "integer"},
    }
    grammar = schema_grammar(node)
    for text in ['{"kids":[]}', '{"kx":1}', '{"k":1}', '{"kids":[{"kidsy":2}]}']:
        assert fits(grammar, text), text
    assert not fits(grammar, '{"kx":"a"}')


def test_values_written_exactly_still_hold_beside_a_recursive_alternative() -> None:
    """The grammar read one character at a time keeps a literal's quotes, backslashes and line
    breaks, and a string's bounds."""
    values = ['say "hi"', "C:\\temp", "two\nlines", "é☃"]
    flat = {"type": "object", "properties": {"e": {"enum": values}, "s": {"type": "string", "maxLength": 3}},
            "required": ["e", "s"], "additionalProperties": False}
    grammar = schema_grammar({"$defs": {"Node": NODE}, "anyOf": [{"$ref": "#/$defs/Node"}, flat]})
    for value in values:
        assert fits(grammar, json.dumps({"e": value, "s": "ab"})), value
    assert not fits(grammar, json.dumps({"e": "zz", "s": "ab"}))
    assert not fits(grammar, json.dumps({"e": values[0], "s": "abcd"}))
