"""Fuzz: a forced call's grammar in Qwen3-Coder's own format (``_xml_tool_grammar``) is made of
the client's tool schemas, which are hostile: odd property names (``<``, ``>``, ``=``, new lines,
``</parameter>``), enums of odd strings, ``required`` of anything, values of any JSON. Each gives
a grammar or a GrammarError (a 400), never another exception (the worker's 500), and a grammar
in the format lets only calls through that read back (api/xml_tool_calls.py) as written: a
string value can never close its parameter early or leave the format."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.responses import parse_tool_calls
from scheduler.engines.grammar import GrammarError, check_bounds, tool_grammar
from tests.edge.strategies import field_values
from tests.engines.test_grammar_keywords import fits

pytest.importorskip("llguidance")

names = st.sampled_from(["city", "\x01", "\u00a0", "a b", "<b>", "a>b", "x=y", "a\nb", "</parameter>", "\u00e9t\u00e9", '"q', "\\", "\x00", "\t", "-"])
odd_text = st.sampled_from(["", "a", "\n", "\nx\n", "</parameter>", "a</parameter", "</parameter>\n", '"', "\\", "\x00", "<tool_call>", "\u00e9", "\x01", "\x7f", "\r", "\u2028", "\U0001f600"])
param_schemas = st.one_of(
    st.just({"type": "string"}),
    st.just({"type": "string", "description": "d"}),
    st.lists(odd_text, min_size=1, max_size=4).map(lambda vs: {"type": "string", "enum": vs}),
    st.sampled_from([{"type": "integer"}, {"type": "boolean"}, {"type": ["string", "null"]}, {"type": "array", "items": {"type": "integer"}}]),
    field_values(st.sampled_from(["type", "enum", "properties", "items", "$ref"]), ints=st.integers(-3, 3), max_leaves=6),
)
schemas = st.fixed_dictionaries(
    {"type": st.just("object"), "properties": st.dictionaries(names, param_schemas, max_size=3)},
    optional={"required": st.one_of(st.lists(names, max_size=3), field_values(max_leaves=4)), "additionalProperties": st.booleans()},
)

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _grammar(params: dict[str, Any]) -> str | None:
    try:
        return tool_grammar([{"name": "f", "parameters": params}], "required", True, fmt="qwen3_coder")
    except GrammarError:
        return None


@SETTINGS
@given(params=schemas)
def test_a_hostile_schema_gives_a_grammar_or_a_400(params: dict[str, Any]) -> None:
    grammar = _grammar(params)
    if grammar is not None:
        check_bounds(grammar)


@SETTINGS
@given(params=schemas, data=st.data())
def test_what_the_format_lets_through_reads_back_as_written(params: dict[str, Any], data: st.DataObject) -> None:
    grammar = _grammar(params)
    if grammar is None or "<function=f>" not in grammar:
        return  # (the JSON format, fuzzed in tests/engines/test_grammar_schema_fuzz.py)
    values: dict[str, str] = {}
    for key, schema in params["properties"].items():
        if schema.get("type") != "string" and schema.get("type") != ["string", "null"]:
            continue  # (the JSON values: their own fuzz)
        enum = schema.get("enum")
        values[key] = data.draw(st.sampled_from(enum) if enum else odd_text.filter(lambda t: "</parameter>" not in t) | st.text(max_size=6))
    if set(params.get("required") or []) - values.keys():
        return
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    text = f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>"
    if not fits(grammar, text):
        # only a value that is none of its schema's may be refused: a string param's text is any text
        assert any(schema.get("enum") for schema in params["properties"].values()), text
        return
    content, calls = parse_tool_calls(text, {"f": params}, fmt="qwen3_coder")
    assert content is None and len(calls) == 1, text
    args = json.loads(calls[0]["function"]["arguments"])
    for key, value in values.items():
        kind = params["properties"][key].get("type")
        assert args[key] == value or (kind != "string" and args[key] is None and value == "null"), (key, value, args)
    for key in values:  # a value holding the closing is never let through
        broken = text.replace(f"<parameter={key}>\n{values[key]}\n", f"<parameter={key}>\n{values[key]}</parameter>x\n", 1)
        assert not fits(grammar, broken), broken



def _worker_sampling(params: dict[str, Any]) -> Any:
    """The forced call's sampling a worker of a Qwen3-Coder model makes for ``params``, its
    engine refusing a grammar that llama.cpp cuts short at a NUL."""
    from pathlib import Path

    from tests.api.test_tool_native_formats_s46 import _worker

    template = (Path(__file__).parent.parent / "api" / "templates_s46" / "qwen3-coder.jinja").read_text()
    worker = _worker(template, {})
    assert worker.tool_format == "qwen3_coder"
    worker.engine.features = frozenset({"template_vars", "grammar"})
    worker.engine.check_grammar = lambda g: "the grammar does not parse" if "\x00" in g else None  # type: ignore[method-assign]
    request = {"endpoint": "chat", "messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "f", "parameters": params}], "tool_choice": "required"}
    return worker._sampling(request)


@pytest.mark.parametrize("required", [True, [{"a": 1}], 5])
def test_a_required_of_no_names_is_a_400_not_a_500(required: Any) -> None:
    """``required`` not a list of names was a TypeError in the worker (its 500 invalid_job, and a
    logged traceback); it is the JSON format's 400, as for every other model."""
    from scheduler.link.messages import INVALID_VALUE
    from scheduler.worker.loop import Refusal

    with pytest.raises(Refusal) as refused:
        _worker_sampling({"type": "object", "properties": {"a": {"type": "string"}}, "required": required})
    assert refused.value.reason == INVALID_VALUE and refused.value.param == "tools"


@pytest.mark.parametrize(
    "params",
    [
        {"type": "object", "properties": {"a": {"type": "string", "enum": ["x\x00y", "z"]}}, "required": ["a"]},
        {"type": "object", "properties": {"a\x00": {"type": "string"}}, "required": ["a\x00"]},
    ],
)
def test_a_nul_in_a_name_or_an_enum_value_is_forced_in_the_json_format(params: dict[str, Any]) -> None:
    """A NUL went raw into the format's literals: llama.cpp reads a grammar as a C string, cut it
    short there and refused it (a 400 "the constraint does not compile"), where the JSON format
    writes it as ``\\u0000`` and forces the call."""
    grammar = _worker_sampling(params).grammar
    assert grammar is not None and "\x00" not in grammar and "<function=f>" not in grammar
    fits(grammar, "")  # (llguidance compiles it)


def test_control_characters_in_names_and_enums_are_escaped_for_both_parsers(engine: Any) -> None:
    """Qwen3-Coder's format writes a property's name and an enum's value as they are: a control
    character in one went raw into a GBNF literal, which llguidance (the MLX engine's matcher)
    refuses ("lexer error": a 400 on MLX for a schema llama.cpp takes). It is its ``\\xHH``
    escape now, which both read, and the call it writes reads back."""
    params = {"type": "object", "properties": {"a\x01": {"type": "integer"}, "b": {"type": "string", "enum": ["x\ty", "z\x7f", "\x1b[0m"]}}, "required": ["a\x01", "b"]}
    grammar = tool_grammar([{"name": "f", "parameters": params}], "required", True, fmt="qwen3_coder")
    assert grammar is not None and "<function=f>" in grammar
    assert engine.check_grammar(grammar) is None
    for value in params["properties"]["b"]["enum"]:
        text = f"<tool_call>\n<function=f>\n<parameter=a\x01>\n7\n</parameter>\n<parameter=b>\n{value}\n</parameter>\n</function>\n</tool_call>"
        assert fits(grammar, text), value
        _content, calls = parse_tool_calls(text, {"f": params}, fmt="qwen3_coder")
        assert json.loads(calls[0]["function"]["arguments"]) == {"a\x01": 7, "b": value}
    assert not fits(grammar, text.replace("\x1b[0m", "zz"))  # (none of the enum's)
