"""``allOf`` holds as the schema it makes: llama-cpp-python's converter read an ``allOf`` only as
objects whose properties it merges, so a part without properties (pydantic's ``{"allOf":
[{"$ref": "#/$defs/Color"}], "default": "red"}`` for an enum field with a default, a string's
bounds) was dropped and the grammar allowed only ``{}``, which fits none of them: the model was
forced to write ``"color": {}``."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.engines.grammar import GrammarError, schema_grammar
from tests.engines.test_grammar_keywords import assert_schema


def _obj(props: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False, **more}


def test_an_all_of_around_one_ref_is_the_definition() -> None:
    schema = _obj({"color": {"allOf": [{"$ref": "#/$defs/Color"}], "default": "red", "description": "a colour"}}, **{"$defs": {"Color": {"enum": ["red", "green"]}}})
    assert_schema(schema, good=[{"color": "red"}, {"color": "green"}], bad=[{"color": {}}, {"color": "blue"}])


def test_an_all_of_of_one_object_keeps_its_own_required() -> None:
    part = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
    assert_schema({"allOf": [part]}, good=[{"a": 1}, {"a": 1, "b": 2}], bad=[{"b": 1}, {}, {"a": "x"}])


def test_all_of_parts_with_different_keywords_hold_together() -> None:
    assert_schema({"allOf": [{"type": "string"}, {"maxLength": 3}]}, good=["", "abc"], bad=["abcd", {}, 1])
    assert_schema({"type": "string", "allOf": [{"minLength": 2}]}, good=["ab"], bad=["a", {}])
    assert_schema(
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False, "allOf": [{"required": ["a"]}]},
        good=[{"a": 1}],
        bad=[{}, {"a": "x"}],
    )


def test_objects_merged_by_the_converter_still_merge() -> None:
    a = {"type": "object", "properties": {"a": {"type": "integer"}}}
    b = {"type": "object", "properties": {"b": {"type": "string"}}}
    assert_schema({"allOf": [a, b]}, good=[{"a": 1, "b": "x"}], bad=[{"a": "x", "b": "x"}, 5])


def test_keywords_beside_an_any_of_or_one_of_hold_in_each_branch() -> None:
    """The converter wrote only the branches: the keywords beside them were dropped, and a
    branch of ``required`` alone allowed any JSON value (``5`` for an object)."""
    props = {"a": {"type": "integer"}, "b": {"type": "integer"}}
    schema = {"type": "object", "properties": props, "additionalProperties": False, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}
    assert_schema(schema, good=[{"a": 1}, {"b": 2}, {"a": 1, "b": 2}], bad=[5, "x", {}, {"a": "x"}])
    assert_schema({"type": "string", "oneOf": [{"maxLength": 2}, {"minLength": 5}]}, good=["ab", "abcde"], bad=[5, {}, "abc"])
    # the same keyword beside and in a branch, with one value
    assert_schema({"type": "string", "anyOf": [{"type": "string", "maxLength": 1}, {"const": "long"}]}, good=["a", "long"], bad=["ab", 1])


def test_keywords_copied_into_many_branches_are_bounded() -> None:
    """Each branch converts its own copy of the keywords beside the ``anyOf``: a wide object
    beside many branches would be converted once per branch on the engine thread, into a
    grammar past the bound; it is refused before."""
    props = {f"p{i}": {"type": "string"} for i in range(3000)}
    schema = {"type": "object", "properties": props, "anyOf": [{"required": [f"p{i}"]} for i in range(1000)]}
    with pytest.raises(GrammarError, match="copied"):
        schema_grammar(schema)


def test_objects_naming_one_property_merge_it_once() -> None:
    """The converter wrote a property named in two parts twice: ``{"a": 1, "a": 1, "b": "x"}``
    was the only object that fitted, and it made every part's properties required."""
    a = {"type": "object", "properties": {"a": {"type": "integer"}}}
    b = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}, "b": {"type": "string"}}, "required": ["b"]}
    assert_schema({"allOf": [a, b]}, good=[{"b": "x"}, {"a": 1, "b": "x"}], bad=[{"a": -1, "b": "x"}, {"a": 1}, {"a": 1, "b": "x", "a2": 1}])


def test_an_all_of_that_does_not_merge_is_a_clear_error() -> None:
    """Only ``{}`` fitted ``{"allOf": [{"type": "string"}, {"type": "integer"}]}``."""
    with pytest.raises(GrammarError, match="allOf"):
        schema_grammar({"allOf": [{"type": "string"}, {"type": "integer"}]})
    with pytest.raises(GrammarError, match="allOf"):
        schema_grammar({"type": "string", "allOf": [{"maxLength": 3}, {"maxLength": 5}]})


def test_an_all_of_of_annotations_only_allows_any_value() -> None:
    assert_schema({"allOf": [{"description": "d"}], "title": "t"}, good=[1, "a", {}, None, [1]], bad=[])
