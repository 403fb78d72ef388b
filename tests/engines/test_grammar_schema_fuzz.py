"""Fuzz: a JSON Schema built from the keywords the grammar enforces (types and their lists,
string and array bounds, integer bounds, enum/const of mixed types and beside other keywords,
objects with required and additional properties, anyOf beside other keywords, oneOf beside an
enum, allOf) converts to a grammar or is a GrammarError, and every value the grammar lets
through validates against the schema (``jsonschema``), over values drawn from the schema itself
and from any JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.engines.grammar import GrammarError, check_bounds, schema_grammar
from tests.engines.test_grammar_keywords import fits

jsonschema = pytest.importorskip("jsonschema")

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

names = st.sampled_from(["a", "b", "é", "a b", '"q', "\\", "\n"])
data = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([2.5, 1.0, 1e3]) | st.sampled_from(["", "a", "ab", "abc", "é", 'a"b', "\n", "😀", "😀a", "aaaa"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=6,
)
types = st.sampled_from(["string", "integer", "number", "boolean", "null", "object", "array"])


def _bounds(lo: str, hi: str, top: int) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={lo: st.integers(0, top), hi: st.integers(0, top)})


# keywords beside a union, which each branch must fit too, and beside an enum or a const,
# which the values written must fit (there string lengths beside a pattern, number bounds and
# multipleOf too: a string's pattern is written without its lengths, a number's bounds are not
# enforced, but an enum value's are)
_sibling_keywords = {
    "type": types | st.lists(types, min_size=1, max_size=2, unique=True),
    "minItems": st.integers(0, 2),
    "maxItems": st.integers(0, 2),
    "items": st.sampled_from([{"type": "integer"}, {"type": "string"}, {"enum": [1, "a"]}]),
    "required": st.lists(names, min_size=1, max_size=2, unique=True),
    "additionalProperties": st.sampled_from([False, {"type": "integer"}]),
}
siblings = st.fixed_dictionaries({}, optional=_sibling_keywords)
data_siblings = st.fixed_dictionaries(
    {},
    optional={
        **_sibling_keywords,
        "minLength": st.integers(0, 2),
        "maxLength": st.integers(0, 2),
        "pattern": st.sampled_from(["^a", "b", "^\\w*$"]),
        "minimum": st.integers(-3, 3),
        "exclusiveMaximum": st.integers(-3, 3),
        "multipleOf": st.sampled_from([2, 0.5]),
        "uniqueItems": st.booleans(),
        "not": st.sampled_from([{"type": "null"}, {"const": "a"}]),
    },
)

leaves = st.one_of(
    types.map(lambda t: {"type": t}),
    st.lists(types, min_size=1, max_size=3, unique=True).map(lambda ts: {"type": ts}),
    st.lists(data, min_size=1, max_size=4).map(lambda vs: {"enum": vs}),
    st.tuples(types, st.lists(data, min_size=1, max_size=4)).map(lambda p: {"type": p[0], "enum": p[1]}),
    data.map(lambda v: {"const": v}),
    st.tuples(data_siblings, st.lists(data, min_size=1, max_size=4)).map(lambda p: {**p[0], "enum": p[1]}),
    st.tuples(data_siblings, data).map(lambda p: {**p[0], "const": p[1]}),
    _bounds("minLength", "maxLength", 3).map(lambda b: {"type": "string", **b}),
    st.fixed_dictionaries({}, optional={"minimum": st.integers(-5, 5), "maximum": st.integers(-5, 2000)}).map(lambda b: {"type": "integer", **b}),
    st.sampled_from(["^[a-c]+$", "^a$|^bc$", "^\\d{1,2}$", "^(ab)*$", "^.?$", "^[^a]$", "^\\w\\s\\w$"]).map(lambda p: {"type": "string", "pattern": p}),
    # lengths beside a pattern: held where the pattern is one character repeated, else 400
    st.tuples(st.sampled_from(["^.*$", "^[a-c]{1,3}$", "^a*$", "^(ab)*$", "^a$|^bc$"]), _bounds("minLength", "maxLength", 3)).map(
        lambda p: {"type": "string", "pattern": p[0], **p[1]}
    ),
)


def _extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    obj = st.tuples(st.dictionaries(names, inner, max_size=3), st.lists(names, max_size=3, unique=True), st.sampled_from([None, True, False]) | inner).map(
        lambda p: {"type": "object", "properties": p[0], "required": p[1], **({} if p[2] is None else {"additionalProperties": p[2]})}
    )
    arr = st.tuples(inner, _bounds("minItems", "maxItems", 3)).map(lambda p: {"type": "array", "items": p[0], **p[1]})
    any_of = st.lists(inner, min_size=1, max_size=3).map(lambda bs: {"anyOf": bs})
    beside_any_of = st.tuples(siblings, st.lists(inner, min_size=1, max_size=3)).map(lambda p: {**p[0], "anyOf": p[1]})
    # (beside an enum: oneOf's exclusivity holds for its values; elsewhere it is anyOf)
    enum_one_of = st.tuples(st.lists(data, min_size=1, max_size=4), st.lists(inner, min_size=1, max_size=3)).map(lambda p: {"enum": p[0], "oneOf": p[1]})
    all_of = st.lists(inner, min_size=1, max_size=2).map(lambda ps: {"allOf": ps, "description": "d"})
    return obj | arr | any_of | beside_any_of | enum_one_of | all_of


schemas = st.recursive(leaves, _extend, max_leaves=6)


def _instances(schema: Any, draw: Any, depth: int = 0) -> Any:
    """A value shaped by ``schema`` (often, not always, one that fits it)."""
    if not isinstance(schema, dict) or depth > 6:
        return draw(data)
    if "enum" in schema and isinstance(schema["enum"], list):
        return draw(st.sampled_from(schema["enum"]))
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema and draw(st.booleans()):
            return _instances(draw(st.sampled_from(schema[key])), draw, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = draw(st.sampled_from(kind))
    if kind == "object":
        props = schema.get("properties", {})
        return {k: _instances(v, draw, depth + 1) for k, v in props.items() if k in schema.get("required", []) or draw(st.booleans())}
    if kind == "array":
        return [_instances(schema.get("items"), draw, depth + 1) for _ in range(draw(st.integers(0, 4)))]
    return draw(data)


@FAST
@given(schema=schemas, draw=st.data())
def test_every_value_the_grammar_allows_fits_the_schema(schema: Any, draw: Any) -> None:
    try:
        grammar = schema_grammar(schema)
        check_bounds(grammar)
    except GrammarError:
        return
    validator = jsonschema.Draft202012Validator(schema)
    for _ in range(8):
        value = _instances(schema, draw.draw)
        text = json.dumps(value, ensure_ascii=draw.draw(st.booleans()))
        if fits(grammar, text):
            assert validator.is_valid(value), f"{text} fits the grammar of {json.dumps(schema)} but not the schema"


@FAST
@given(props=st.dictionaries(st.sampled_from(["a", "b c", "é", "<x>", "q\""]), schemas, min_size=1, max_size=3), draw=st.data())
def test_a_forced_call_in_qwen3_coders_format_reads_back_as_arguments_that_fit(props: dict[str, Any], draw: Any) -> None:
    """The same schemas as a tool's parameters, its call forced in Qwen3-Coder's own format
    (scheduler.engines.grammar._xml_tool_grammar): a grammar or a GrammarError, and every call the
    grammar lets through reads back (api/xml_tool_calls.py) as arguments that fit the schema."""
    from api.responses import parse_tool_calls
    from scheduler.engines.grammar import tool_grammar

    params = {"type": "object", "properties": props, "required": [k for k in props if draw.draw(st.booleans())]}
    try:
        grammar = tool_grammar([{"name": "f", "parameters": params}], "required", True, fmt="qwen3_coder")
        assert grammar is not None
        check_bounds(grammar)
    except GrammarError:
        return
    if "<function=f>" not in grammar:
        return  # (the JSON format: the test above)
    validator = jsonschema.Draft202012Validator(params)
    for _ in range(6):
        value = _instances(params, draw.draw)
        if not isinstance(value, dict):
            continue
        body = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n" for k, v in value.items())
        text = f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>"
        if fits(grammar, text):
            content, calls = parse_tool_calls(text, {"f": params}, fmt="qwen3_coder")
            assert content is None and len(calls) == 1, text
            arguments = json.loads(calls[0]["function"]["arguments"])
            assert validator.is_valid(arguments), f"{text!r} fits the grammar of {json.dumps(params)} but reads back as {arguments}"
