"""A JSON Schema's ``pattern``: the regular-expression escapes everyone writes (``\\d``, ``\\w``,
``\\s``, an escaped ``.``) are enforced on both engines, not refused as a grammar that does not
parse. Each grammar goes through llguidance (the MLX engine's matcher) over single bytes and
through llama.cpp's own grammar sampler (the bundled model's vocabulary)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.engines.grammar import GrammarError, check_bounds, schema_grammar
from tests.engines.test_grammar_extra_keys import llama_fits
from tests.engines.test_grammar_keywords import fits

CASES: list[tuple[str, list[str], list[str]]] = [
    (r"^\d{3}-\d{4}$", ["555-1234"], ["555-12345", "abc-defg", "5551234"]),
    (r"^[\w.+-]+@[\w-]+\.[a-z]{2,}$", ["ann.lee+x@mail-1.com"], ["ann@mail", "ann@mail_com", "a b@c.de"]),
    (r"^v\d+\.\d+$", ["v1.20"], ["v1x20", "v1"]),
    (r"^\w+\s\w+$", ["Ann Lee"], ["Ann  Lee", "AnnLee"]),
    (r"^\D+$", ["abc"], ["a1"]),
    (r"^\S+$", ["a-b"], ["a b"]),
    (r"^[\-\/]+$", ["-/-"], ["a"]),
    (r"^\$\^$", ["$^"], ["x"]),
    # alternatives outside any group, each anchored: the converter's "|" split the string's
    # quotes apart, and a reply "a$ (no closing quote) fitted
    (r"^a$|^b$", ["a", "b"], ["a$", "^b", "ab"]),
    (r"^[a-z]+$|^$", ["abc", ""], ["abc$", "^", "A"]),
    (r"^(x)|(y)\d$", ["x", "y1"], ["z", "y"]),
    (r"^a\|b$", ["a|b"], ["a", "b"]),
    # non-capturing groups (slugs, semver, paths in real tools' schemas): the converter refused
    # "(?:" (a 400 for a forced call, an unheld auto reply)
    (r"^[a-z0-9]+(?:-[a-z0-9]+)*$", ["a-b-c", "x1"], ["a-", "-a", "A", "a--b"]),
    (r"^(?:ab|cd)+$", ["ab", "cdab"], ["", "ac", "(?:ab)"]),
    (r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[\da-z-]+(?:\.[\da-z-]+)*)?$", ["1.2.3", "1.0.0-rc.1"], ["1.2", "01.2.3", "1.2.3-"]),
]


def _schema(pattern: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"v": {"type": "string", "pattern": pattern}}, "required": ["v"], "additionalProperties": False}


@pytest.mark.parametrize(("pattern", "good", "bad"), CASES)
def test_pattern_escapes_are_enforced_on_both_engines(pattern: str, good: list[str], bad: list[str]) -> None:
    check_pattern(pattern, good, bad)


def check_pattern(pattern: str, good: list[str], bad: list[str], not_json: list[str] | None = None) -> None:
    """A string property of ``pattern``: both engines' grammars take each of ``good`` (as JSON
    text), neither takes any of ``bad`` nor any text of ``not_json``."""
    grammar = schema_grammar(_schema(pattern))
    check_bounds(grammar)
    for value in good:
        text = json.dumps({"v": value})
        assert fits(grammar, text), f"{text!r} matches /{pattern!r}/ but the MLX engine's grammar refuses it"
        assert llama_fits(grammar, text), f"{text!r} matches /{pattern!r}/ but llama.cpp's grammar refuses it"
    for value in bad:
        text = json.dumps({"v": value})
        assert not fits(grammar, text), f"{value!r} does not match /{pattern!r}/ but the grammar allows it"
        assert not llama_fits(grammar, text), f"{value!r} does not match /{pattern!r}/ but llama.cpp allows it"
    for text in not_json or []:
        assert not fits(grammar, text) and not llama_fits(grammar, text), f"{text!r} is not JSON"


def test_a_negated_shorthand_inside_a_class_is_refused_cleanly() -> None:
    with pytest.raises(GrammarError):
        schema_grammar({"type": "string", "pattern": r"^[\Da]$"})


def _fits_both(grammar: str, text: str) -> bool:
    return fits(grammar, text) and llama_fits(grammar, text)


def _refused_by_both(grammar: str, text: str) -> bool:
    return not fits(grammar, text) and not llama_fits(grammar, text)


@pytest.mark.parametrize("pattern", [r"^.+$", r"^.{1,20}$", r"^[^,]+$", r"^[^@]+@[^@]+$"])
def test_a_dot_or_a_negated_class_lets_an_object_close_and_keeps_its_string_json(pattern: str) -> None:
    """``.`` (llama.cpp's ``[^\\x0A\\x0D]``) and a negated class took a raw ``"`` and control
    characters into the string: on llama.cpp a reply could be ``{"v": "a"b"}`` (not JSON), and on
    the MLX engine llguidance's greedy lexer read the closing quote and the ``}`` as more of the
    string, so no object with such a property could ever close (a reply ran to max_tokens)."""
    grammar = schema_grammar(_schema(pattern))
    check_bounds(grammar)
    value = "ann@x.org"
    assert _fits_both(grammar, json.dumps({"v": value}))
    assert _refused_by_both(grammar, '{"v": "a"b@c"}')
    assert _refused_by_both(grammar, '{"v": "a\tb@c"}')


def test_a_dot_takes_a_json_escape_as_one_character() -> None:
    grammar = schema_grammar(_schema(r"^.{3}$"))
    for value in ('a"b', "a\\b", "a\tb"):
        assert _fits_both(grammar, json.dumps({"v": value})), value
    for value in ("abcd", "a\nb"):  # "." is no line break
        assert _refused_by_both(grammar, json.dumps({"v": value})), value


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        ({"pattern": "^a*$", "maxLength": 2}, ["", "a", "aa"], ["aaa", "aaaa"]),
        ({"pattern": "^a*$", "minLength": 2, "maxLength": 3}, ["aa", "aaa"], ["a", "aaaa"]),
        ({"pattern": r"^\d+$", "minLength": 3}, ["123", "12345"], ["12", "1a3"]),
        ({"pattern": "^[a-z]{1,10}$", "maxLength": 3}, ["a", "abc"], ["abcd", ""]),
        ({"pattern": "^.{2,}$", "maxLength": 2}, ["ab", 'a"'], ["abc", "a"]),
        # the pattern's strings all fit the lengths already: enforced as the pattern is
        ({"pattern": r"^[A-Z]{2}\d{4}$", "minLength": 6, "maxLength": 6}, ["AB1234"], ["AB123", "A1234"]),
        ({"pattern": "^(yes|no)$", "maxLength": 3}, ["yes", "no"], ["nope"]),
    ],
)
def test_a_strings_lengths_beside_its_pattern_are_enforced(schema: dict[str, Any], good: list[str], bad: list[str]) -> None:
    """The converter wrote a pattern's grammar and dropped ``minLength``/``maxLength`` beside it:
    ``{"pattern": "^a*$", "maxLength": 2}`` let ``"aaaa"`` through."""
    grammar = schema_grammar({"type": "object", "properties": {"v": {"type": "string", **schema}}, "required": ["v"], "additionalProperties": False})
    check_bounds(grammar)
    for value in good:
        assert _fits_both(grammar, json.dumps({"v": value})), value
    for value in bad:
        assert _refused_by_both(grammar, json.dumps({"v": value})), value


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "^a+b*$", "maxLength": 3},  # no exact grammar: refused, not ignored
        {"type": "string", "pattern": "^a{5,}$", "maxLength": 3},  # no string fits both
    ],
)
def test_lengths_a_pattern_cannot_hold_are_refused_not_ignored(schema: dict[str, Any]) -> None:
    with pytest.raises(GrammarError):
        schema_grammar(schema)


def test_an_enum_beside_a_pattern_and_lengths_is_its_fitting_values() -> None:
    """(the values are checked against the pattern and the lengths: no 400 for the pattern's form)"""
    grammar = schema_grammar({"type": "string", "enum": ["a", "aaa", "b"], "pattern": "^a+b*$", "maxLength": 2})
    assert _fits_both(grammar, '"a"')
    assert _refused_by_both(grammar, '"aaa"') and _refused_by_both(grammar, '"b"')


NON_CAPTURING = [r"^(?:ab|a)*$", r"^a(?:b(?:c|d)?)+$", r"^(?:a|b)(?:-(?:a|b))*$", r"^[ab](?:\-[ab]){0,2}$", r"^(?:a)?(b)?(?:)$"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=st.sampled_from(NON_CAPTURING), value=st.text(alphabet="abcd-?:()", max_size=8))
def test_a_non_capturing_group_matches_what_python_matches(pattern: str, value: str) -> None:
    grammar = schema_grammar(_schema(pattern))
    assert fits(grammar, json.dumps({"v": value})) == bool(re.fullmatch(pattern, value)), (pattern, value)


PYDANTIC_DECIMAL = r"^(?!^[-+.]*$)[+-]?0*\d*\.?\d*$"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.text(alphabet="+-.09e ", max_size=6))
def test_pydantics_decimal_pattern_matches_what_python_matches(value: str) -> None:
    """pydantic writes a ``Decimal`` field as a number or a string of this pattern, whose
    lookahead the converter refused: every tool with a Decimal parameter was a 400 when forced.
    It is held as the same strings without the lookahead."""
    from decimal import Decimal

    from pydantic import BaseModel

    class Price(BaseModel):
        amount: Decimal

    schema = Price.model_json_schema()
    assert schema["properties"]["amount"]["anyOf"][1]["pattern"] == PYDANTIC_DECIMAL
    grammar = schema_grammar(schema)
    assert fits(grammar, json.dumps({"amount": value})) == bool(re.fullmatch(PYDANTIC_DECIMAL, value)), value
    assert fits(grammar, '{"amount": 12.5}')
