"""``required`` naming a key that ``properties`` does not declare: the grammar never wrote the
key, so every reply lacked it (``{"a": 1}`` for ``"required": ["a", "z"]``) and the one that fits
the schema was refused."""

from __future__ import annotations

import pytest

from scheduler.engines.grammar import GrammarError, schema_grammar, tool_grammar
from tests.engines.test_grammar_keywords import assert_schema


def test_a_required_name_beside_the_properties_is_written() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "z"]}
    assert_schema(schema, good=[{"a": 1, "z": 2}, {"a": 1, "z": "x"}], bad=[{"a": 1}, {"z": 1}])
    typed = {**schema, "additionalProperties": {"type": "string"}}
    assert_schema(typed, good=[{"a": 1, "z": "x"}, {"a": 1, "z": "x", "q": "y"}], bad=[{"a": 1}, {"a": 1, "z": 2}])


def test_required_keys_of_an_object_without_properties_are_written() -> None:
    assert_schema({"type": "object", "required": ["z"]}, good=[{"z": 1}, {"z": 1, "y": [2]}], bad=[{}, {"y": 2}])
    assert_schema({"type": "object", "required": ["z"], "additionalProperties": {"type": "integer"}}, good=[{"z": 1}], bad=[{}, {"z": "x"}])


def test_a_required_name_that_additional_properties_false_forbids_is_a_clear_error() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "z"], "additionalProperties": False}
    with pytest.raises(GrammarError, match="'z'"):
        schema_grammar(schema)
    with pytest.raises(GrammarError, match="'z'"):
        tool_grammar([{"name": "f", "description": "", "parameters": schema}], "required", False)
