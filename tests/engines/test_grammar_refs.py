"""A ``$ref`` is enforced as the definition it points to, whatever else in the grammar has the
definition's name: llama-cpp-python's converter named a definition's rule by the reference's
last segment and took any rule of that name already there for it. So two tools'
``#/$defs/Item`` (two pydantic models of one name), a tool's and the answer format's, a property
``user`` beside ``#/$defs/user``, or a definition named ``call`` (the tool grammar's own rule)
got the wrong rule: the model was forced to write arguments that do not fit the schema."""

from __future__ import annotations

import json
from typing import Any

from scheduler.engines.grammar import check_bounds, schema_grammar, tool_grammar, tools_or_format_grammar
from tests.engines.test_grammar_keywords import fits


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _tool(name: str, defs: dict[str, Any], props: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "description": "", "parameters": {"$defs": defs, **_obj(props)}}


def _call(name: str, arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


SKU = _tool("add_item", {"Item": _obj({"sku": {"type": "string"}})}, {"item": {"$ref": "#/$defs/Item"}})
QTY = _tool("set_qty", {"Item": _obj({"qty": {"type": "integer"}})}, {"item": {"$ref": "#/$defs/Item"}})


def test_two_tools_with_a_definition_of_the_same_name_each_get_their_own() -> None:
    grammar = tool_grammar([SKU, QTY], "required", True)
    check_bounds(grammar)
    assert fits(grammar, _call("add_item", {"item": {"sku": "a1"}}))
    assert fits(grammar, _call("set_qty", {"item": {"qty": 2}}))
    assert not fits(grammar, _call("set_qty", {"item": {"sku": "a1"}}))


def test_a_tools_definition_and_the_answer_formats_of_the_same_name_each_hold() -> None:
    answer = {"$defs": {"Item": {"type": "integer"}}, **_obj({"answer": {"$ref": "#/$defs/Item"}})}
    grammar = tools_or_format_grammar([SKU], True, {"type": "json_schema", "schema": answer})
    check_bounds(grammar)
    assert fits(grammar, json.dumps({"answer": 3}))
    assert fits(grammar, _call("add_item", {"item": {"sku": "a1"}}))
    assert not fits(grammar, json.dumps({"answer": {"sku": "a1"}}))


def test_a_property_named_like_a_definition_does_not_replace_it() -> None:
    schema = {
        "$defs": {"user": _obj({"id": {"type": "integer"}})},
        **_obj({"user": {"type": "string", "enum": ["a", "b"]}, "owner": {"$ref": "#/$defs/user"}}),
    }
    grammar = schema_grammar(schema)
    assert fits(grammar, json.dumps({"user": "a", "owner": {"id": 1}}))
    assert not fits(grammar, json.dumps({"user": "a", "owner": "b"}))


def test_a_definition_named_like_the_tool_grammars_own_rules_does_not_replace_them() -> None:
    for own in ("call", "answer"):
        tool = _tool("f", {own: _obj({"z": {"type": "integer"}})}, {"n": {"$ref": f"#/$defs/{own}"}})
        forced = tool_grammar([tool], "required", True)
        assert fits(forced, _call("f", {"n": {"z": 1}})), own
        either = tools_or_format_grammar([tool], True, {"type": "json_schema", "schema": _obj({"x": {"type": "boolean"}})})
        assert fits(either, _call("f", {"n": {"z": 1}})), own
        assert fits(either, json.dumps({"x": True})), own


def test_recursive_definitions_still_recurse() -> None:
    node = {"$defs": {"Node": _obj({"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}})}, "$ref": "#/$defs/Node"}
    grammar = schema_grammar(node)
    assert fits(grammar, json.dumps({"v": 1, "kids": [{"v": 2, "kids": []}]}))
    assert not fits(grammar, json.dumps({"v": 1, "kids": [{"v": 2}]}))
    tool = _tool("t", {"Node": node["$defs"]["Node"]}, {"root": {"$ref": "#/$defs/Node"}, "node": {"$ref": "#/$defs/Node"}})
    forced = tool_grammar([tool], "required", True)
    tree = {"v": 1, "kids": [{"v": 2, "kids": []}]}
    assert fits(forced, _call("t", {"root": tree, "node": tree}))
    assert not fits(forced, _call("t", {"root": tree, "node": {"v": 1}}))


def test_two_tools_that_each_refer_to_their_own_root_each_recurse_into_their_own() -> None:
    """``{"$ref": "#"}`` (OpenAI's own way to write a recursive schema) in two tools: each
    becomes a ``RootSchema`` definition of its own, and the second tool's nested value had to be
    the first tool's arguments."""
    tree = _tool("tree", {}, {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}})
    chain = _tool("chain", {}, {"s": {"type": "string"}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}})
    grammar = tool_grammar([tree, chain], "required", True)
    assert fits(grammar, _call("chain", {"s": "a", "next": {"s": "b", "next": None}}))
    assert fits(grammar, _call("tree", {"v": 1, "kids": [{"v": 2, "kids": []}]}))
    assert not fits(grammar, _call("chain", {"s": "a", "next": {"v": 2, "kids": []}}))


def test_a_pointer_with_escaped_segments_finds_its_definition() -> None:
    """RFC 6901 writes "/" in a name as ``~1`` and "~" as ``~0``, and a URI fragment may
    %-encode: the converter split on every "/" and unescaped nothing, so such a $ref was a 400
    although the definition is there."""
    for name, ref in [("a/b", "#/$defs/a~1b"), ("a~b", "#/$defs/a~0b"), ("a b", "#/$defs/a%20b"), ("x/y~z", "#/definitions/x~1y~0z")]:
        where = "definitions" if "definitions" in ref else "$defs"
        schema = {where: {name: _obj({"n": {"type": "integer"}})}, **_obj({"v": {"$ref": ref}})}
        grammar = schema_grammar(schema)
        assert fits(grammar, json.dumps({"v": {"n": 1}})), ref
        assert not fits(grammar, json.dumps({"v": {"n": "x"}})), ref


def test_a_recursive_definition_with_an_escaped_name_recurses() -> None:
    node = _obj({"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/linked~1node"}, {"type": "null"}]}})
    grammar = schema_grammar({"$defs": {"linked/node": node}, "$ref": "#/$defs/linked~1node"})
    assert fits(grammar, json.dumps({"v": 1, "next": {"v": 2, "next": None}}))
    assert not fits(grammar, json.dumps({"v": 1, "next": {"v": "2", "next": None}}))


def test_no_ref_but_a_pointer_into_the_schema_reaches_the_converter(monkeypatch: Any) -> None:
    """The converter's guard against fetching a remote $ref is an ``assert``: under ``python -O``
    it is gone and the worker would fetch whatever URL a client named. Refused before it."""
    import pytest
    from llama_cpp import llama_grammar

    from scheduler.engines.grammar import GrammarError

    fetched: list[str] = []
    monkeypatch.setattr(llama_grammar.SchemaConverter, "__init__", _without_fetch_guard(llama_grammar.SchemaConverter.__init__))
    monkeypatch.setitem(__import__("sys").modules, "requests", type("R", (), {"get": staticmethod(lambda url: fetched.append(url))}))
    for ref in ["https://example.com/s.json#/x", "http://10.0.0.1/s.json", "other.json#/x", "//example.com/s.json"]:
        with pytest.raises(GrammarError, match="remote"):
            schema_grammar({"type": "object", "properties": {"a": {"$ref": ref}}, "required": ["a"]})
    assert fetched == []


def _without_fetch_guard(init: Any) -> Any:
    """The converter as ``python -O`` runs it: its ``assert self._allow_fetch`` never fails."""

    def patched(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._allow_fetch = True

    return patched


def test_a_ref_inside_enum_or_const_data_is_data_written_exactly_and_never_resolved() -> None:
    """An enum's or a const's value is data, even one with a "$ref" key: the converter resolved it
    as a reference, so the model was forced to write a rewritten value ({"$ref": "request-#/..."}
    for "#"), or the request was a 400 for a pointer that names nothing, or refused as a remote
    reference although nothing is fetched."""
    for value in ({"$ref": "#"}, {"$ref": "#/definitions/x"}, {"$ref": "https://example.com/s.json"}, {"a": [{"$ref": "#/$defs/A"}]}):
        grammar = schema_grammar({"enum": [value, "plain"]})
        check_bounds(grammar)
        assert fits(grammar, json.dumps(value)) and fits(grammar, '"plain"')
        assert not fits(grammar, json.dumps({"$ref": "other"}))
        answer = _obj({"kind": {"const": value}, "n": {"type": "integer", "default": value}})
        grammar = schema_grammar(answer)
        assert fits(grammar, json.dumps({"kind": value, "n": 3}))
        assert not fits(grammar, json.dumps({"kind": "plain", "n": 3}))
    tool = _tool("tag", {}, {"tag": {"enum": [{"$ref": "#"}]}})
    grammar = tool_grammar([tool], "required", True)
    assert fits(grammar, _call("tag", {"tag": {"$ref": "#"}}))
    # a client's own string that looks like the carrier stays a string
    grammar = schema_grammar({"enum": ["sf-data-0123456789abcdef:e30=", {"$ref": "#"}]})
    assert fits(grammar, '"sf-data-0123456789abcdef:e30="') and not fits(grammar, "{}")
