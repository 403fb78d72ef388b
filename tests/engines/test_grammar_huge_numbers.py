"""A JSON Schema's numbers at any size (structured output, tools): JSON has no bound on an
integer, and ``json.loads`` keeps a 401-digit literal exact as 10**400, which no float holds.
Each schema compiles to the grammar it means or is refused with a GrammarError (the worker's 400
naming ``response_format`` or ``tools``); never an OverflowError (``math.isfinite(10**400)``
raised one: outside the converter a 500, inside it a 400 that said only "int too large to convert
to float" and refused schemas that mean something), nor a grammar that does not parse."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api import schemas
from scheduler.engines import grammar as grammars
from scheduler.engines.grammar import GrammarError, check_bounds, schema_grammar, tool_grammar, tools_or_format_grammar
from scheduler.engines.sim import SimEngine
from scheduler.engines.token_mask import _lark
from scheduler.link.messages import INVALID_VALUE, Rejected, Submit, decode, encode
from tests.core.test_worker_rules import make_worker, run
from tests.engines.test_grammar_keywords import assert_schema, fits

HUGE = json.loads("1" + "0" * 400)  # as a client's 401-digit literal reads: 10**400, exact
assert HUGE == 10**400 and isinstance(HUGE, int)


def _compiles_or_is_refused(schema: Any) -> str | None:
    """The grammar for ``schema`` (sent as JSON text, as a client's is), through each public
    entry point that compiles a schema: a response format, a forced tool call's arguments, a
    tool call or an answer in the format. None where it is refused, with a GrammarError of the
    compiler's own words (not an overflow it caught)."""
    schema = json.loads(json.dumps(schema))
    tool = {"name": "f", "parameters": {"type": "object", "properties": {"x": schema}, "required": ["x"]}}
    makers: list[Callable[[], str | None]] = [
        lambda: schema_grammar(schema),
        lambda: tool_grammar([tool], "required", True),
        lambda: tools_or_format_grammar([{"name": "g", "parameters": {"type": "object"}}], True, {"type": "json_schema", "schema": schema}),
    ]
    made = None
    for make in makers:
        try:
            grammar = make()
            assert grammar is not None
            check_bounds(grammar)
        except GrammarError as exc:
            assert "too large to convert" not in str(exc) and "Overflow" not in str(exc), exc
            continue
        _lark(grammar)  # it parses (what the engines' parsers get)
        made = made or grammar
    return made


_EVERY_KEYWORD = [
    *({"type": kind, key: n} for kind in ("integer", "number", ["integer", "null"]) for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf") for n in (HUGE, -HUGE)),
    *({"type": kind, key: n} for kind, keys in (("string", ("minLength", "maxLength")), ("array", ("minItems", "maxItems")), ("object", ("minProperties", "maxProperties")))
      for key in keys for n in (HUGE, -HUGE)),
    {"enum": [HUGE, 1, -HUGE]},
    {"const": HUGE},
    {"const": -HUGE, "type": ["integer", "null"]},
    {"enum": [HUGE, 1.5, 2], "type": "integer", "minimum": 2},
    {"enum": [1, 2, HUGE], "maximum": 1.5},
    {"enum": [HUGE, 1.5], "multipleOf": HUGE},
    {"enum": [HUGE, 1], "minimum": HUGE},
    {"enum": [1, 2], "oneOf": [{"type": "integer", "maximum": HUGE}, {"type": "integer", "minimum": HUGE}]},
    {"minimum": HUGE, "anyOf": [{"type": "integer"}, {"type": "string"}]},
    {"type": "integer", "maximum": 1.5, "anyOf": [{"type": "integer", "maximum": HUGE}, {"type": "string"}]},
    {"type": "integer", "allOf": [{"minimum": -HUGE}, {"maximum": HUGE}]},
    {"type": "array", "items": False, "minItems": HUGE},
    {"type": "array", "items": False, "maxItems": HUGE},
    {"type": "string", "pattern": "^a*$", "maxLength": HUGE},
    {"type": "string", "pattern": "^(ab)*$", "maxLength": HUGE},
    {"type": "string", "pattern": "^a*$", "minLength": -HUGE},
    {"type": "string", "pattern": "^a*$", "minLength": HUGE},
    {"type": "string", "minLength": HUGE, "maxLength": 2},
]


@pytest.mark.parametrize("schema", _EVERY_KEYWORD, ids=lambda s: json.dumps(s).replace("1" + "0" * 400, "1e400")[:80])
def test_a_huge_integer_in_any_keyword_compiles_or_is_refused_in_the_compilers_words(schema: dict[str, Any]) -> None:
    _compiles_or_is_refused(schema)


def test_huge_integer_bounds_mean_what_they_say() -> None:
    """A bound past every integer the grammar writes is no bound; one that leaves nothing it can
    write (every integer above 10**400) is refused, naming the digits."""
    assert_schema({"type": "integer", "maximum": HUGE}, good=[0, 7, -5, 10**15], bad=[1.5, "1"])
    assert_schema({"type": "integer", "minimum": -HUGE}, good=[0, -7, 10**15], bad=["1"])
    assert_schema({"type": "integer", "minimum": 0, "exclusiveMaximum": HUGE}, good=[0, 10**15], bad=[-1])
    assert_schema({"type": ["integer", "null"], "minimum": 3, "maximum": HUGE}, good=[3, 10**15, None], bad=[2, -3])
    assert_schema({"type": "integer", "allOf": [{"minimum": -HUGE}, {"maximum": 10}]}, good=[10, -10**15], bad=[11])
    with pytest.raises(GrammarError, match="digits"):
        schema_grammar({"type": "integer", "minimum": HUGE})
    with pytest.raises(GrammarError, match="digits"):
        schema_grammar({"type": "integer", "exclusiveMaximum": -HUGE})


def test_huge_integers_in_tool_arguments_hold() -> None:
    grammar = tool_grammar(
        [{"name": "f", "parameters": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": HUGE}}, "required": ["n"]}}],
        {"name": "f"}, False,
    )
    assert grammar is not None
    call = '<tool_call>\n{"name": "f", "arguments": {"n": %s}}\n</tool_call>'
    assert fits(grammar, call % "3") and not fits(grammar, call % "0")


def test_huge_enum_and_const_values_are_written_and_checked_exactly() -> None:
    assert_schema({"enum": [HUGE, 1]}, good=[HUGE, 1], bad=[HUGE + 1, 2])
    assert_schema({"const": -HUGE}, good=[-HUGE], bad=[HUGE, 0])
    # the values beside keywords are checked against them exactly (10**400 > 2, and is an integer)
    assert_schema({"enum": [HUGE, 1.5, 1], "type": "integer", "minimum": 2}, good=[HUGE], bad=[1, 1.5])
    assert_schema({"enum": [1, 2, HUGE], "maximum": 1.5}, good=[1], bad=[2, HUGE])
    assert_schema({"enum": [HUGE, 3], "multipleOf": 2}, good=[HUGE], bad=[3])
    assert_schema({"enum": [HUGE, 5], "exclusiveMinimum": HUGE - 1}, good=[HUGE], bad=[5])
    with pytest.raises(GrammarError, match="const"):
        schema_grammar({"const": HUGE, "maximum": 1e308})


def test_huge_lengths_and_item_counts_mean_what_they_say() -> None:
    # a string no longer than 10**400 characters: any string the pattern matches
    assert_schema({"type": "string", "pattern": "^a*$", "maxLength": HUGE}, good=["", "aaaa"], bad=["b"])
    assert_schema({"type": "string", "pattern": "^a*$", "minLength": -HUGE}, good=["", "aa"], bad=["b"])
    assert_schema({"type": "string", "maxLength": HUGE, "enum": ["a", "bb"]}, good=["a", "bb"], bad=["c"])
    assert_schema({"type": "array", "items": False, "maxItems": HUGE}, good=[[]], bad=[[1]])
    with pytest.raises(GrammarError, match="'items': false allows no item"):
        schema_grammar({"type": "array", "items": False, "minItems": HUGE})
    for schema in ({"type": "string", "minLength": HUGE}, {"type": "array", "maxItems": HUGE}, {"type": "string", "pattern": "^a*$", "minLength": HUGE}):
        with pytest.raises(GrammarError, match="repeats an item more than"):
            check_bounds(schema_grammar(schema))


def test_lengths_and_counts_that_are_not_whole_numbers_are_rounded_inward_or_refused() -> None:
    """JSON Schema's lengths and item counts are whole; one written as a float was written into
    the grammar as it was (``char{2.5,}``, ``{0,1e+20}``), which no engine's parser reads."""
    assert_schema({"type": "string", "minLength": 2.5}, good=["abc", "abcd"], bad=["ab"])
    assert_schema({"type": "string", "maxLength": 2.0}, good=["", "ab"], bad=["abc"])
    assert_schema({"type": "string", "minLength": -3, "maxLength": 1}, good=["", "a"], bad=["ab"])
    assert_schema({"type": "array", "minItems": 1.5}, good=[[1, 2]], bad=[[], [1]])
    assert_schema({"type": "array", "minItems": -1, "maxItems": 1.5}, good=[[], [1]], bad=[[1, 2]])
    check_bounds(schema_grammar({"type": "array", "maxItems": 1e4}))
    with pytest.raises(GrammarError, match="repeats"):
        check_bounds(schema_grammar({"type": "array", "maxItems": 1e20}))
    with pytest.raises(GrammarError):
        schema_grammar({"type": "string", "minLength": 2.5, "maxLength": 2.7})
    for value in (True, "3", [1]):
        with pytest.raises(GrammarError, match="minLength"):
            schema_grammar({"type": "string", "minLength": value})


# -- property: any schema of the number keywords, with integers past any float -----------------

_ints = st.integers(-(10**500), 10**500) | st.sampled_from([HUGE, -HUGE, 2**1024, -(2**1024), 2**63, 10**16, 10**16 - 1, -(10**16), 0, 1, -1])
_floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1.7976931348623157e308, -1.7976931348623157e308, 5e-324, 0.5, 2.0, 1e16])
_numbers = _ints | _floats | st.integers(-3, 1030)
_types = st.sampled_from(["integer", "number", "string", "array", "object"])
_keywords = st.fixed_dictionaries(
    {},
    optional={
        "type": _types | st.lists(_types | st.just("null"), min_size=1, max_size=2, unique=True),
        **{k: _numbers for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")},
        **{k: _numbers for k in ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")},
        "enum": st.lists(_numbers, min_size=1, max_size=3),
        "const": _numbers,
        "pattern": st.sampled_from(["^a*$", "^[0-9]{2,5}$", "b"]),
        "items": st.sampled_from([False, {"type": "integer"}]),
    },
)
_schemas = _keywords | st.builds(lambda a, b, k: {**a, k: [b, {"type": "null"}]}, _keywords, _keywords, st.sampled_from(["anyOf", "oneOf"])) | st.builds(
    lambda a, b: {"allOf": [a, b]}, _keywords, _keywords
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_schemas)
def test_any_schema_of_number_keywords_at_any_size_compiles_or_is_refused(schema: dict[str, Any]) -> None:
    _compiles_or_is_refused(schema)


# -- the worker: a 400 naming the parameter, never invalid_job (a 500) ---------------------------


class _GrammarSim(SimEngine):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.features = frozenset({"grammar"})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer", "minimum": HUGE}}}}, "response_format"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
             "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer", "exclusiveMinimum": HUGE}}}},
            "response_format",
        ),
        ({"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer", "minimum": HUGE}}}}}]}, "tools"),
    ],
)
def test_the_worker_refuses_a_huge_bound_it_cannot_write_naming_the_parameter(body: dict[str, Any], param: str, caplog: pytest.LogCaptureFixture) -> None:
    """Through the API's parser, the link and the worker: the refusal is invalid_value (a 400
    naming the parameter), not the invalid_job (a 500) an OverflowError in the compiler made."""
    for cache in (grammars._cached_schema_grammar, grammars._cached_tool_grammar, grammars._cached_tools_or_format):
        cache.cache_clear()
    raw = json.dumps({"model": "sim", "messages": [{"role": "user", "content": "hi"}], **body}).encode()
    request = schemas.parse_chat_request(raw, models=["sim"]).to_wire()
    worker, conn = make_worker(_GrammarSim(n_lanes=2, lane_ctx=4096))
    with caplog.at_level(logging.ERROR):
        worker.handle(conn, decode(encode(Submit(id="j", request=request, qos=1))))  # type: ignore[arg-type]
        run(worker, 50)
    refused = [m for m in conn.sent if isinstance(m, Rejected)]
    assert len(refused) == 1 and refused[0].reason == INVALID_VALUE and refused[0].param == param, refused
    assert "digits" in refused[0].detail
    assert not [r for r in caplog.records if r.exc_info], "the worker logged a traceback"


def test_a_length_beside_a_pattern_is_read_as_one_without() -> None:
    assert_schema({"type": "string", "pattern": "^a*$", "minLength": 1.5, "maxLength": 3.5}, good=["aa", "aaa"], bad=["a", "aaaa"])
    assert_schema({"type": "string", "pattern": "^a*$", "minLength": -2}, good=["", "a"], bad=["b"])
    with pytest.raises(GrammarError, match="minLength"):
        schema_grammar({"type": "string", "pattern": "^a*$", "maxLength": "3"})


@pytest.mark.parametrize(("answer", "good", "bad"), [({"type": "integer"}, "5", '"5"'), ({"type": "string"}, '"a"', "5"), ({"type": "number", "maximum": HUGE}, "2.5", '"x"')])
def test_a_format_of_a_primitive_type_beside_tools_is_a_rule_of_the_grammar(answer: dict[str, Any], good: str, bad: str) -> None:
    """tool_choice auto with such a format: the root's "... | answer" named a rule that the
    converter never wrote (a primitive's rule is its own, "integer"), and no parser read it."""
    grammar = tools_or_format_grammar([{"name": "f", "parameters": {"type": "object"}}], True, {"type": "json_schema", "schema": answer})
    assert fits(grammar, good) and not fits(grammar, bad)
    assert fits(grammar, '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')
