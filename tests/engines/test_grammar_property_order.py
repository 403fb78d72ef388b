"""A schema's properties come in the schema's order, as OpenAI writes them, also when one is
called ``name`` or ``arguments``: the converter was given the tool call's own order (``name``
first, then ``arguments``) for every object, so ``{"reasoning": ..., "name": ...}`` had to be
written name first (the answer before the reasoning it rests on), in ``response_format`` and in
a tool's arguments alike. The call itself still writes ``name`` before ``arguments``."""

from __future__ import annotations

import json

from scheduler.engines.grammar import schema_grammar, tool_grammar, tools_or_format_grammar
from tests.engines.test_grammar_keywords import fits

SCHEMA = {
    "type": "object",
    "properties": {"reasoning": {"type": "string"}, "arguments": {"type": "string"}, "name": {"type": "string"}},
    "required": ["reasoning", "arguments", "name"],
    "additionalProperties": False,
}
VALUE = {"reasoning": "r", "arguments": "a", "name": "n"}


def _call(name: str, arguments: object) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_a_response_formats_properties_keep_the_schemas_order() -> None:
    grammar = schema_grammar(SCHEMA)
    assert fits(grammar, json.dumps(VALUE))
    either = tools_or_format_grammar([{"name": "f", "description": "", "parameters": {}}], True, {"type": "json_schema", "schema": SCHEMA})
    assert fits(either, json.dumps(VALUE))


def test_a_tools_arguments_keep_the_schemas_order_and_the_call_is_name_first() -> None:
    grammar = tool_grammar([{"name": "f", "description": "", "parameters": SCHEMA}], "required", True)
    assert fits(grammar, _call("f", VALUE))
    assert not fits(grammar, "<tool_call>\n" + json.dumps({"arguments": VALUE, "name": "f"}) + "\n</tool_call>")
