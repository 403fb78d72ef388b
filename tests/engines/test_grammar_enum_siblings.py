"""An ``enum`` or a ``const`` beside other keywords, and keywords beside a union: the grammar
lets through only the values the whole schema allows. The converter wrote an enum's values (a
const's value) whatever the keywords beside them said, and a union's keywords were dropped from
every branch as soon as one branch did not merge with them."""

from __future__ import annotations

import pytest

from scheduler.engines.grammar import GrammarError, schema_grammar
from tests.engines.test_grammar_keywords import assert_schema


def test_enum_values_hold_to_the_string_and_number_keywords_beside_them() -> None:
    assert_schema({"type": "string", "enum": ["a", 1, "bb"], "maxLength": 1}, good=["a"], bad=[1, "bb"])
    assert_schema({"enum": ["", "ab", "abc"], "minLength": 2}, good=["ab", "abc"], bad=[""])
    assert_schema({"enum": [1, 3, 5, "x"], "minimum": 3}, good=[3, 5, "x"], bad=[1])
    assert_schema({"enum": [1, 3, 5], "exclusiveMaximum": 5}, good=[1, 3], bad=[5])
    assert_schema({"enum": [2, 3, 4.5, 0.3], "multipleOf": 1.5}, good=[3, 4.5], bad=[2, 0.3])
    assert_schema({"enum": ["ab", "cd", 7], "pattern": "^a"}, good=["ab", 7], bad=["cd"])


def test_enum_values_hold_to_the_array_and_object_keywords_beside_them() -> None:
    assert_schema({"enum": [[1, 2], [1, "a"], [], [1, 1]], "items": {"type": "integer"}, "minItems": 1, "uniqueItems": True}, good=[[1, 2]], bad=[[1, "a"], [], [1, 1]])
    assert_schema(
        {"enum": [{"a": 1}, {"b": 2}, {"a": "x"}, {"a": 1, "c": 0}], "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False},
        good=[{"a": 1}],
        bad=[{"b": 2}, {"a": "x"}, {"a": 1, "c": 0}],
    )
    assert_schema({"enum": ["a", 1, None], "anyOf": [{"type": "string"}, {"type": "null"}], "description": "d"}, good=["a", None], bad=[1])
    assert_schema({"enum": ["a", 1, None], "not": {"type": "null"}}, good=["a", 1], bad=[None])


def test_a_const_beside_an_enum_or_keywords_it_does_not_fit_is_refused() -> None:
    with pytest.raises(GrammarError, match="const"):
        schema_grammar({"const": "abc", "maxLength": 2})
    with pytest.raises(GrammarError, match="const"):
        schema_grammar({"const": "a", "enum": ["b"]})
    with pytest.raises(GrammarError, match="enum"):
        schema_grammar({"enum": [1, 2], "minimum": 10})
    assert_schema({"const": 1, "enum": [1.0, 2]}, good=[1], bad=[2])


def test_a_union_branch_that_cannot_fit_the_keywords_beside_the_union_is_dropped() -> None:
    """``{"type": "string", "anyOf": [..., {"type": "integer"}]}``: the integer branch did not
    merge with the string type, so every branch was written bare and 5 fitted."""
    assert_schema({"type": "string", "anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer"}]}, good=["ab"], bad=["abc", 5])
    assert_schema({"type": ["string", "null"], "oneOf": [{"type": "string", "minLength": 1}, {"type": ["integer", "null"]}]}, good=["a", None], bad=["", 1])
    assert_schema({"type": "number", "anyOf": [{"type": "integer", "maximum": 3}, {"type": "string"}]}, good=[3, -2], bad=[4, 2.5, "a"])
    assert_schema({"enum": ["a", "b", 1, 2], "anyOf": [{"enum": ["a", 1]}, {"const": 2}]}, good=["a", 1, 2], bad=["b"])
    with pytest.raises(GrammarError, match="oneOf"):
        schema_grammar({"type": "integer", "oneOf": [{"type": "string"}, {"type": "null"}]})


def test_a_union_branch_that_allows_nothing_does_not_refuse_the_others() -> None:
    """A branch that merged into an enum of no fitting value, or into crossed bounds, refused
    the whole schema (a 400) though the other branches allow values."""
    assert_schema({"type": "string", "anyOf": [{"enum": [1]}, {"maxLength": 3}]}, good=["ab"], bad=[1, "abcd"])
    assert_schema({"minimum": 5, "anyOf": [{"type": "integer", "maximum": 3}, {"type": "string"}]}, good=["a"], bad=[3, 5])
    assert_schema({"maxLength": 1, "anyOf": [{"type": "string", "minLength": 2}, {"type": "boolean"}]}, good=[True], bad=["ab", "a"])


def test_object_keywords_beside_a_union_hold_in_its_branches() -> None:
    """Properties both beside the union and in a branch did not merge: the branch was written
    bare, so ``{"b": "x"}`` fitted though ``a`` is required, and ``{"a": 1, "b": "x"}`` did not."""
    assert_schema(
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "anyOf": [{"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
        good=[{"a": 1, "b": "x"}],
        bad=[{"b": "x"}, {"a": 1}, {"a": "s", "b": "x"}],
    )


def test_an_all_of_parts_additional_properties_hold_for_the_other_parts_properties() -> None:
    """Merging an allOf's objects dropped each part's ``additionalProperties``: a property that
    one part's ``false`` forbids, or its schema constrains, was written as the other part has it."""
    assert_schema(
        {"allOf": [{"properties": {"a": {}}, "additionalProperties": False}, {"properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}]},
        good=[{"a": 1}, {}],
        bad=[{"b": "x"}, {"a": "s"}],
    )
    assert_schema({"allOf": [{"properties": {"a": {}}, "additionalProperties": {"type": "integer"}}, {"properties": {"b": {}}}]}, good=[{"b": 1}, {"a": "s"}], bad=[{"b": "x"}])
    with pytest.raises(GrammarError, match="additionalProperties"):
        schema_grammar({"allOf": [{"properties": {"a": {}}, "additionalProperties": False}, {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})


def test_a_union_branch_that_allows_nothing_is_dropped_without_keywords_beside_too() -> None:
    assert_schema({"anyOf": [{"type": "string"}, {"type": "string", "enum": [None]}]}, good=["a"], bad=[None])
    assert_schema({"oneOf": [{"type": "integer", "minimum": 3, "maximum": 1}, {"type": "null"}]}, good=[None], bad=[2])
    with pytest.raises(GrammarError, match="anyOf"):
        schema_grammar({"anyOf": [{"const": 1, "type": "string"}, False]})


def test_a_const_or_enum_beside_a_list_of_types_is_served() -> None:
    """A list of types was split into one branch per type, each with the const: the branch of
    the type the value is not of refused the whole schema."""
    assert_schema({"type": ["string", "null"], "const": "a"}, good=["a"], bad=[None, "b"])
    assert_schema({"allOf": [{"type": ["string", "integer"]}, {"type": "integer", "minimum": 0, "maximum": 0}]}, good=[0], bad=[1, "0"])


def test_a_pattern_that_backtracks_for_ever_against_an_enum_value_is_refused_in_time() -> None:
    """The values are checked against the pattern on the engine thread: a pattern that
    backtracks exponentially on one of them is a 400 within a fraction of a second, not a
    worker held for minutes (without the check's time limit this test does not end)."""
    with pytest.raises(GrammarError, match="too long"):
        schema_grammar({"enum": ["a" * 40 + "b", "c"], "pattern": "^(a|aa)+$"})


def test_large_enums_beside_enums_are_checked_in_linear_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each value of one enum is looked up in the other's set of keys, not compared with each
    of its values: the keys made grow with the values, not with their product (counted, not timed)."""
    from scheduler.engines import grammar

    made: list[int] = []
    real = grammar._json_key

    def counted(value: object) -> str:
        made.append(1)
        return real(value)

    monkeypatch.setattr(grammar, "_json_key", counted)
    schema_grammar({"enum": list(range(2_000)), "anyOf": [{"enum": list(range(1_000, 3_000))}], "uniqueItems": True})
    assert 0 < len(made) < 20 * 4_000, len(made)


def test_an_enum_beside_a_ref_holds() -> None:
    """The converter wrote the ``$ref`` and dropped the enum beside it: ``"c"`` fitted."""
    assert_schema(
        {"type": "object", "properties": {"x": {"$ref": "#/$defs/S", "enum": ["a", "b", 1]}}, "required": ["x"], "$defs": {"S": {"type": "string", "maxLength": 1}}},
        good=[{"x": "a"}, {"x": "b"}],
        bad=[{"x": "c"}, {"x": 1}],
    )


def test_a_list_of_one_type_keeps_what_that_type_alone_keeps() -> None:
    """``"type": ["object"]`` skipped the fixes a schema of ``"type": "object"`` gets: its
    ``required`` without ``properties`` (``{}`` fitted), an array's ``minItems`` without ``items``."""
    assert_schema({"type": ["object"], "required": ["a"]}, good=[{"a": 1}], bad=[{}])
    assert_schema({"type": ["array"], "minItems": 2}, good=[[1, 2]], bad=[[]])


def test_an_enum_beside_a_one_of_leaves_out_the_values_two_branches_hold() -> None:
    """``oneOf`` is written as ``anyOf``; an enum's value that two branches hold fits no
    ``oneOf`` and was written all the same."""
    assert_schema({"enum": ["a", "bb", 1], "oneOf": [{"type": "string"}, {"maxLength": 1}]}, good=["bb", 1], bad=["a"])
    with pytest.raises(GrammarError, match="oneOf"):
        schema_grammar({"const": "a", "oneOf": [{"type": "string"}, {"maxLength": 1}]})
