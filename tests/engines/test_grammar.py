"""Constraints as GBNF (scheduler.engines.grammar): what a request's schema or tools become, and
that hostile schemas are a clean GrammarError (a 400), never a crash of the engine thread."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.engines.grammar import (
    JSON_OBJECT_GBNF,
    GrammarError,
    response_grammar,
    schema_grammar,
    tool_grammar,
    tools_or_format_grammar,
)

WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CLOCK = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}


def test_response_formats_map_to_grammars() -> None:
    assert response_grammar(None) is None
    assert response_grammar({"type": "json_object"}) == JSON_OBJECT_GBNF
    assert response_grammar({"type": "grammar", "grammar": 'root ::= "x"'}) == 'root ::= "x"'
    g = response_grammar({"type": "json_schema", "schema": {"type": "object", "properties": {"n": {"type": "integer"}}}})
    assert g is not None and '"\\"n\\""' in g


def test_strings_in_schema_grammars_exclude_raw_control_characters() -> None:
    g = schema_grammar({"type": "object", "properties": {"s": {"type": "string"}}})
    assert 'char ::= [^"\\\\\\x7F\\x00-\\x1F]' in g


def test_tool_grammar_forces_the_named_function_once_and_required_allows_parallel_calls() -> None:
    assert tool_grammar([WEATHER], "auto", True) is None and tool_grammar([WEATHER], "none", True) is None
    named = tool_grammar([WEATHER, CLOCK], {"name": "get_weather"}, True)
    assert named is not None and '"\\"get_weather\\""' in named and "get_time" not in named
    assert re.search(r"^root ::= .*\"\\n</tool_call>\"$", named, re.M)
    required = tool_grammar([WEATHER, CLOCK], "required", True)
    assert required is not None and "get_time" in required and "{0,3}" in required
    assert "{0,3}" not in (tool_grammar([WEATHER, CLOCK], "required", False) or "")


def test_unenforceable_schemas_are_grammar_errors() -> None:
    for bad in ({"$ref": "#/nowhere"}, {"type": "string", "pattern": "(("}, [1], "x"):
        try:
            schema_grammar(bad)
        except GrammarError:
            continue
        raise AssertionError(f"{bad!r} converted")


def test_a_remote_ref_is_refused_in_the_servers_words_not_llama_cpps_command_line() -> None:
    """The converter's refusal named a flag of llama.cpp's command-line tool, which a client of
    this API has no way to pass."""
    with pytest.raises(GrammarError) as err:
        schema_grammar({"$ref": "https://example.com/schema.json"})
    assert "remote" in str(err.value) and "--allow-fetch" not in str(err.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["type", "properties", "items", "required", "enum", "const", "$ref", "anyOf",
                         "minLength", "maxLength", "pattern", "minimum", "additionalProperties", "x"]),
        inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(json_values)
def test_any_schema_converts_or_is_a_grammar_error(schema: Any) -> None:
    try:
        g = schema_grammar(schema)
    except GrammarError:
        return
    assert "root ::=" in g or "root   ::=" in g
    json.dumps(schema)  # what came in was JSON: nothing was mutated into something else


def test_integer_bounds_are_enforced_as_an_enum_when_the_range_is_small() -> None:
    g = schema_grammar({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150}}})
    age = next(line for line in g.splitlines() if line.startswith("age ::="))
    assert '"150"' in age and '"151"' not in age and '"-' not in age
    assert schema_grammar({"type": "integer", "minimum": 5, "exclusiveMaximum": 8}).splitlines()[0] == 'root ::= "5" | "6" | "7"'


def test_draft_4_boolean_exclusive_bounds_exclude_the_bound_itself() -> None:
    """``"minimum": 0, "exclusiveMinimum": true`` (JSON Schema draft 4) means above 0: the enum
    let the model write the 0 the schema forbids (and 10 for an exclusive maximum of 10)."""
    schema = {"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maximum": 10, "exclusiveMaximum": True}
    assert schema_grammar(schema).splitlines()[0] == "root ::= " + " | ".join(f'"{i}"' for i in range(1, 10))
    inclusive = {"type": "integer", "minimum": 0, "exclusiveMinimum": False, "maximum": 2}
    assert schema_grammar(inclusive).splitlines()[0] == 'root ::= "0" | "1" | "2"'


# OpenAI's own recursive-schema example (root recursion, "#") and what pydantic writes for a
# self-referencing model (a root $ref into $defs): both were 400s as a response_format
UI = {"type": "object", "properties": {"type": {"type": "string", "enum": ["div", "button"]}, "label": {"type": "string"},
                                       "children": {"type": "array", "items": {"$ref": "#"}}},
      "required": ["type", "label", "children"], "additionalProperties": False}
NODE = {"$defs": {"Node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}},
                           "required": ["v"]}}, "$ref": "#/$defs/Node"}


def rules_of(grammar: str) -> tuple[set[str], set[str]]:
    """(rules defined, rule names referenced) in a GBNF grammar."""
    defined, used = set(), set()
    for line in grammar.splitlines():
        name, sep, body = line.partition("::=")
        if not sep:
            continue
        defined.add(name.strip())
        body = re.sub(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]', " ", body)  # literals and classes
        used |= set(re.findall(r"[A-Za-z][A-Za-z0-9-]*", body))
    return defined, used


@pytest.mark.parametrize("schema", [UI, NODE], ids=["root-recursion", "root-ref-into-defs"])
def test_recursive_schemas_convert_wherever_they_are_used_and_every_rule_is_defined(schema: dict[str, Any]) -> None:
    tool = [{"name": "f", "parameters": schema}]
    for grammar in (schema_grammar(schema), tool_grammar(tool, "required", True),
                    tools_or_format_grammar(tool, True, {"type": "json_schema", "schema": schema})):
        defined, used = rules_of(grammar)
        assert used <= defined, used - defined
    recursive = schema_grammar(schema)
    rule = "RootSchema" if schema is UI else "Node"
    assert re.search(rf"^{rule} ::=", recursive, re.M) and re.search(rf"::= .*\b{rule}\b", recursive)  # it refers to itself


# -- the schema's key order is the reply's -----------------------------------------------------

ORDERED = {
    "type": "object",
    "properties": {"reasoning": {"type": "string"}, "answer": {"type": "integer"}},
    "required": ["reasoning", "answer"],
    "additionalProperties": False,
}


def _kv_order(line: str) -> bool:
    return line.index("reasoning-kv") < line.index("answer-kv")


def test_structured_output_and_tool_arguments_keep_the_schemas_property_order() -> None:
    """The cache key was the schema dumped with sorted keys, and the converter was given that
    key parsed back: every reply's keys came in alphabetical order ({"answer": 4, "reasoning":
    ...}), where OpenAI keeps the schema's order, which reasoning-then-answer schemas rely on."""
    from scheduler.engines.grammar import tools_or_format_grammar

    root = next(x for x in schema_grammar(ORDERED).splitlines() if x.startswith("root ::="))
    assert _kv_order(root), root
    forced = tool_grammar([{"name": "answer", "description": "", "parameters": ORDERED}], {"name": "answer"}, True)
    assert forced is not None
    assert _kv_order(next(x for x in forced.splitlines() if "reasoning-kv" in x and "answer-kv" in x and "::=" in x))
    either = tools_or_format_grammar([{"name": "lookup", "description": "", "parameters": {"type": "object", "properties": {}}}], True,
                                     {"type": "json_schema", "schema": ORDERED})
    assert _kv_order(next(x for x in either.splitlines() if x.startswith("answer ::=")))
