"""Structured output: the JSON a schema's grammar lets through is the JSON the schema allows.

Each grammar is run through llguidance (the MLX engine's matcher, over the same GBNF that
llama.cpp's grammar sampler gets) with a vocabulary of the 256 single bytes, so a text fits the
grammar exactly when its bytes do, whatever a model's tokens would be."""

from __future__ import annotations

import json
from functools import cache, lru_cache
from typing import Any

import pytest
from pydantic import BaseModel, Field

from scheduler.engines.grammar import GrammarError, check_bounds, schema_grammar, tool_grammar
from scheduler.engines.token_mask import _lark


@cache
def _byte_tokenizer() -> Any:
    import llguidance
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from scheduler.engines.hf_vocab import byte_decoder

    by_byte = sorted(byte_decoder().items(), key=lambda kv: kv[1])
    tok = Tokenizer(models.BPE(vocab={ch: b for ch, b in by_byte}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<eos>", special=True)])
    return llguidance.LLTokenizer(tok.to_str(), n_vocab=257, eos_token=[256])


@lru_cache(maxsize=64)
def _fresh_matcher(gbnf: str) -> Any:
    """A matcher of ``gbnf`` that has read nothing. Building one compiles the grammar (ms, tens
    of ms for a tool grammar); the tests read several texts with each grammar, so :func:`fits`
    reads each with a copy of this one, the same state as a matcher just built."""
    import llguidance

    matcher = llguidance.LLMatcher(_byte_tokenizer(), _lark(gbnf), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher


def fits(gbnf: str, text: str) -> bool:
    matcher = _fresh_matcher(gbnf).deep_copy()
    data = list(text.encode("utf-8"))
    return matcher.try_consume_tokens(data) == len(data) and bool(matcher.is_accepting())


def assert_schema(schema: Any, good: list[Any], bad: list[Any]) -> None:
    grammar = schema_grammar(schema)
    check_bounds(grammar)
    for value in good:
        assert fits(grammar, json.dumps(value)), f"{value!r} fits {schema!r} but the grammar refuses it"
    for value in bad:
        assert not fits(grammar, json.dumps(value)), f"{value!r} does not fit {schema!r} but the grammar allows it"


def test_a_nullable_type_keeps_the_schemas_other_keywords() -> None:
    """``"type": [X, "null"]`` (OpenAI's own way to write an optional field in strict mode) kept
    only the bare types: a nullable object allowed any object, a nullable array any items, and
    a nullable string's enum or length was dropped."""
    assert_schema(
        {"type": ["object", "null"], "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False},
        good=[None, {"a": 1}],
        bad=[{}, {"a": "x"}, {"a": 1, "b": 2}],
    )
    assert_schema({"type": ["array", "null"], "items": {"type": "integer"}}, good=[None, [1, 2]], bad=[["x"]])
    assert_schema({"type": ["string", "null"], "enum": ["red", "green", None]}, good=["red", None], bad=["blue"])
    assert_schema({"type": ["string", "null"], "maxLength": 2}, good=["ab", None], bad=["abc"])


def test_a_schema_that_constrains_nothing_allows_any_value() -> None:
    """``{}``, ``true`` and annotations alone (a pydantic ``Any`` field is ``{"title": ...}``)
    are any JSON value: ``{}`` allowed only objects, an annotation-only schema was refused, and
    ``items: {}`` (pydantic's ``list[Any]``) failed to convert."""
    anything = [1, "s", None, True, [1, "a"], {"k": [2]}]
    schema = {
        "type": "object",
        "properties": {"a": {}, "b": {"title": "B", "description": "anything"}, "c": True, "d": {"type": "array", "items": {}}},
        "required": ["a", "b", "c", "d"],
        "additionalProperties": False,
    }
    assert_schema(
        schema,
        good=[{"a": v, "b": v, "c": v, "d": [v, v]} for v in anything],
        bad=[{"a": 1, "b": 1, "c": 1, "d": 1}],
    )


def test_additional_properties_may_follow_optional_ones_or_not() -> None:
    """With ``additionalProperties`` true (or a schema), an object that wrote an optional property
    had to write an additional one after it: ``{"a": 1}`` did not fit."""
    assert_schema(
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True},
        good=[{}, {"a": 1}, {"a": 1, "b": "x"}, {"b": [1]}, {"a": 1, "b": 2, "c": None}],
        bad=[{"a": "x"}],
    )
    assert_schema(
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"],
         "additionalProperties": {"type": "string"}},
        good=[{"a": 1}, {"a": 1, "b": 2}, {"a": 1, "c": "x"}, {"a": 1, "b": 2, "c": "x", "d": "y"}],
        bad=[{"a": 1, "c": 2}],
    )


@pytest.mark.parametrize("text", ['say "hi"', "C:\\temp", "two\nlines", "tab\there"])
def test_enum_const_and_property_names_are_written_exactly(text: str) -> None:
    """A value or a name holding a quote, a backslash or a line break: the converter wrote the
    JSON text into a GBNF literal without escaping its backslashes, so ``\\n`` came out as a raw
    line break inside the string (not JSON), ``\\\\`` as one backslash (another value), and a
    ``"`` as a grammar that does not parse."""
    assert_schema({"enum": [text, "other"]}, good=[text, "other"], bad=["x"])
    assert_schema({"const": text}, good=[text], bad=["x"])
    assert_schema(
        {"type": "object", "properties": {text: {"type": "integer"}}, "required": [text], "additionalProperties": False},
        good=[{text: 1}],
        bad=[{text: "x"}, {"x": 1}],
    )


def test_integer_bounds_hold_one_sided_and_wide() -> None:
    """``minimum``/``maximum`` were enforced only as a closed range of at most 1024 values."""
    assert_schema({"type": "integer", "minimum": 0}, good=[0, 7, 10, 123456789], bad=[-1, -50])
    assert_schema({"type": "integer", "maximum": 10}, good=[10, 0, -5, -123456], bad=[11, 100])
    assert_schema({"type": "integer", "exclusiveMinimum": 0}, good=[1, 99999], bad=[0, -1])
    assert_schema({"type": "integer", "minimum": 1, "maximum": 100000}, good=[1, 9, 10, 99999, 100000], bad=[0, 100001, -1])
    assert_schema({"type": "integer", "minimum": -250, "maximum": 5000}, good=[-250, -1, 0, 4999, 5000], bad=[-251, 5001])
    assert_schema({"type": "integer", "minimum": 0, "maximum": 2**63 - 1}, good=[0, 10**15], bad=[-1])
    assert_schema({"type": ["integer", "null"], "minimum": 18}, good=[18, 200, None], bad=[17, -18])
    with pytest.raises(GrammarError):
        schema_grammar({"type": "integer", "minimum": 5, "maximum": 1})


def test_integer_bounds_hold_in_tool_arguments() -> None:
    grammar = tool_grammar(
        [{"name": "set_volume", "parameters": {"type": "object", "properties": {"level": {"type": "integer", "minimum": 0}},
                                               "required": ["level"], "additionalProperties": False}}],
        {"name": "set_volume"}, False,
    )
    assert grammar is not None
    call = '<tool_call>\n{"name": "set_volume", "arguments": {"level": %s}}\n</tool_call>'
    assert fits(grammar, call % "3") and not fits(grammar, call % "-3")


def test_array_length_bounds_hold_without_items() -> None:
    assert_schema({"type": "array", "minItems": 2}, good=[[1, "a"], [1, 2, 3]], bad=[[], [1]])
    assert_schema({"type": "array", "maxItems": 1}, good=[[], ["x"]], bad=[[1, 2]])


def test_items_false_allows_only_the_empty_array() -> None:
    """``items: false`` (no item fits) was a 400 reading only ``'prefixItems'`` (the converter's
    KeyError); with ``minItems`` above 0 no array fits, a 400 that says so."""
    assert_schema({"type": "array", "items": False}, good=[[]], bad=[[1], [[]], {}])
    assert_schema({"type": "object", "properties": {"none": {"type": "array", "items": False}}, "required": ["none"]}, good=[{"none": []}], bad=[{"none": [0]}])
    with pytest.raises(GrammarError, match="minItems"):
        schema_grammar({"type": "array", "items": False, "minItems": 1})


class Address(BaseModel):
    street: str
    city: str


class Person(BaseModel):
    name: str
    age: int = Field(ge=0)
    address: Address | None
    extra: Any
    tags: list[Any]


def test_a_pydantic_models_schema_is_enforced() -> None:
    """What ``client.beta.chat.completions.parse(response_format=Person)`` sends: ``$defs``
    ``Address`` beside the property ``address`` (two rules llguidance's converter named alike,
    so the MLX engine refused the schema), ``Any`` fields (an annotation-only schema, refused),
    ``list[Any]`` (refused) and ``ge=0`` (ignored)."""
    schema = Person.model_json_schema()
    address = {"street": "1 Main St", "city": "Paris"}
    assert_schema(
        schema,
        good=[
            {"name": "Ann", "age": 30, "address": address, "extra": [1, {"x": None}], "tags": ["a", 2]},
            {"name": "Bob", "age": 0, "address": None, "extra": "s", "tags": []},
        ],
        bad=[
            {"name": "Ann", "age": -1, "address": None, "extra": 1, "tags": []},
            {"name": "Ann", "age": 3, "address": {"street": "x"}, "extra": 1, "tags": []},
        ],
    )


def test_rule_names_that_differ_only_in_case_or_dashes_compile_for_the_mlx_engine() -> None:
    """llguidance's GBNF-to-Lark converter renames rules (``-`` to ``_``, camelCase to snake,
    ``root`` to ``start``) and refused a grammar where two names came out alike."""
    schemas: list[dict[str, Any]] = [
        {"type": "object", "properties": {"start": {"enum": ["a", "b"]}}, "required": ["start"]},
        {"type": "object", "properties": {"fooBar": {"enum": ["a"]}, "foo_bar": {"enum": ["b"]}, "foo-bar": {"enum": ["c"]}},
         "required": ["fooBar", "foo_bar", "foo-bar"]},
    ]
    for schema in schemas:
        good = {k: v["enum"][0] for k, v in schema["properties"].items()}
        assert_schema(schema, good=[good], bad=[{k: "z" for k in good}])
