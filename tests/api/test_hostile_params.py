"""Generation parameters built to make the shared engine worker's grammar work explode, checked
where they are bounded, before llama.cpp parses anything (the real server's side is in
tests/e2e/test_hostile_params.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler.engines import grammar as grammars


def test_a_long_literal_repeated_many_times_is_refused() -> None:
    # llama.cpp's parser writes every copy out: 5,000 characters x 2,000 copies = 10M elements
    with pytest.raises(grammars.GrammarError, match="expand"):
        grammars.check_bounds('root ::= "' + "a" * 5000 + '"{2000}')
    with pytest.raises(grammars.GrammarError, match="expand"):
        grammars.check_bounds("root ::= x x\nx ::= [abcdefghij] " + '"' + "b" * 2000 + '" {0,1500}')


@pytest.mark.parametrize(
    "grammar",
    [
        'root ::= "' + "a" * 500 + '"{2000}',
        "root ::= x{0,10000}\nx ::= [a-z]",
        grammars.JSON_OBJECT_GBNF,
        grammars.schema_grammar({"type": "string", "maxLength": 10000}),
        grammars.schema_grammar({"type": "array", "items": {"type": "string", "maxLength": 100}, "maxItems": 1000}),
    ],
)
def test_ordinary_repetitions_pass(grammar: str) -> None:
    grammars.check_bounds(grammar)


def test_many_optional_properties_convert_in_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-cpp-python's converter built each suffix of an object's optional properties again
    from every start: O(n^2) rule additions (3 objects of 900 held the engine thread 9 s)."""
    from llama_cpp import llama_grammar

    calls = 0
    add_rule = llama_grammar.SchemaConverter._add_rule

    def counting(self: Any, name: str, rule: str) -> str:
        nonlocal calls
        calls += 1
        return str(add_rule(self, name, rule))

    monkeypatch.setattr(llama_grammar.SchemaConverter, "_add_rule", counting)
    n = 400
    schema = {"type": "object", "properties": {f"q{i}": {"type": "integer"} for i in range(n)}}
    grammar = grammars._cached_schema_grammar.__wrapped__(json.dumps(schema))
    assert "q399-kv" in grammar
    assert calls < 5 * n


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_PROP_SCHEMAS = st.sampled_from([{"type": "integer"}, {"type": "string", "maxLength": 5}, {"type": "boolean"}, {"$ref": "#/$defs/node"},
                                 {"type": "object", "properties": {"x": {"type": "number"}}}, {"type": "array", "items": {"type": "string"}}])
_OBJECTS = st.builds(
    lambda props, required, extra: {
        "type": "object",
        "properties": props,
        "required": [k for k in props if k in required],
        **({} if extra is None else {"additionalProperties": extra}),
        "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}, "v": {"type": "integer"}}}},
    },
    st.dictionaries(st.sampled_from(["name", "arguments", "a", "b", "c-d", "e e", "f", "g", "h", "kv"]), _PROP_SCHEMAS, max_size=8),
    st.sets(st.sampled_from(["name", "arguments", "a", "b", "c-d", "e e", "f"])),
    # additional properties allowed are written otherwise (after optional ones, optionally):
    # tests/engines/test_grammar_keywords.py checks what those grammars accept
    st.sampled_from([None, False]),
)


_VALUES = {"integer": 1, "string": "ab", "boolean": True, "object": {"x": 1.5}, "array": ["a"]}


def _value(schema: dict[str, Any]) -> Any:
    return {"next": {"v": 2}, "v": 1} if "$ref" in schema else _VALUES[schema["type"]]


@settings(max_examples=150, deadline=None)
@given(_OBJECTS, st.data())
def test_the_linear_object_rule_takes_the_properties_in_the_schemas_order(schema: dict[str, Any], data: st.DataObject) -> None:
    """The converter's _build_object_rule is replaced (grammar.py) by one that makes each rule
    once and takes the properties in the schema's order, each optional one written or left out:
    llama-cpp-python's wrote the required ones first, so ``{"a": 1, "b": 2}`` (``a`` optional)
    did not fit where ``b`` is required. An object missing a required property never fits."""
    from tests.engines.test_grammar_keywords import fits

    grammar = grammars.schema_grammar(schema)
    grammars.check_bounds(grammar)
    props, required = schema["properties"], set(schema["required"])
    written = [k for k in props if k in required or data.draw(st.booleans(), label=k)]
    value = {k: _value(props[k]) for k in written}
    assert fits(grammar, json.dumps(value))
    for k in required:
        assert not fits(grammar, json.dumps({j: v for j, v in value.items() if j != k}))


def test_rules_chained_through_optional_starts_are_refused_before_llama_cpp_sees_them() -> None:
    """"r0 ::= r1? r1?", "r1 ::= r2? r2?", ...: the ways to start multiply at each rule, and
    llama.cpp's grammar set-up explored them all. A 20 KB grammar of 900 such rules hung the
    worker for good (every other request with it) and /health still said ok. Even a few levels
    make hundreds of thousands of ways."""
    for levels in (6, 900):
        chain = "root ::= r0\n" + "\n".join(f"r{i} ::= r{i + 1}? r{i + 1}?" for i in range(levels)) + f'\nr{levels} ::= "a"'
        with pytest.raises(grammars.GrammarError, match="ways"):
            grammars.check_bounds(chain)


@pytest.mark.parametrize(
    "grammar",
    [
        "root ::= r0\n" + "\n".join(f'r{i} ::= "a" r{i + 1}' for i in range(20_000)) + '\nr20000 ::= "a"',  # deep, not wide
        "root ::= r0\n" + "\n".join(f"r{i} ::= r{i + 1}? r{i + 1}?" for i in range(3)) + '\nr3 ::= "a"',
        grammars.schema_grammar({"type": "object", "properties": {f"q{i}": {"type": "integer"} for i in range(900)}}),
        grammars.tool_grammar(
            [{"name": f"t{i}", "description": "", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}} for i in range(600)],
            "required",
            True,
        ),
    ],
    ids=["a chain of 20,000 rules", "three optional levels", "900 optional properties", "600 tools, required"],
)
def test_wide_and_deep_grammars_agents_send_pass(grammar: str | None) -> None:
    assert grammar is not None
    grammars.check_bounds(grammar)


def test_a_schema_longer_than_a_grammar_may_be_is_refused_before_it_is_converted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Converting runs on the engine thread at about 1 s per MiB of schema, and the body may be
    8 MiB: a schema whose text is over the grammar's own bound is refused unconverted."""
    from llama_cpp import llama_grammar

    def never(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("converted")

    monkeypatch.setattr(llama_grammar.SchemaConverter, "visit", never)
    schema = {"type": "object", "properties": {f"p{i:07d}": {"type": "integer"} for i in range(40_000)}}
    with pytest.raises(grammars.GrammarError, match="characters long"):
        grammars.schema_grammar(schema)
