"""A function whose ``parameters`` schema is not an object schema.

A call's arguments are a JSON object (OpenAI's ``arguments``, and what the reply's parser takes
as a call), and OpenAI refuses such a tool: 400 "Invalid schema for function 'f': schema must be
a JSON Schema of 'type: "object"', got 'type: "string"'", ``param``
``tools[0].function.parameters``. It was accepted: with ``tool_choice`` required or naming the
function the grammar forced ``"arguments": "<a string>"``, which is no call, so the reply came
back with no ``tool_calls``, the call's markup as its content, finishing ``stop``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.errors import ApiError
from api.responses import Reply
from api.schemas import parse_chat_request
from scheduler.engines.grammar import tool_grammar
from scheduler.link.messages import Delta, Done

USER = [{"role": "user", "content": "hi"}]


def _parse(**body: Any) -> Any:
    return parse_chat_request(json.dumps({"model": "m", "messages": USER, **body}).encode(), models=("m",))


def _tool(parameters: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


@pytest.mark.parametrize("parameters", [{"type": "string"}, {"type": "array", "items": {}}, {"type": "integer"}, {"type": "null"}])
@pytest.mark.parametrize("legacy", [False, True])
def test_a_function_whose_parameters_are_not_an_object_schema_is_refused_naming_them(parameters: dict[str, Any], legacy: bool) -> None:
    body = {"functions": [_tool(parameters)["function"]]} if legacy else {"tools": [_tool(parameters)], "tool_choice": "required"}
    with pytest.raises(ApiError) as info:
        _parse(**body)
    assert info.value.status == 400
    assert info.value.param == ("functions[0].parameters" if legacy else "tools[0].function.parameters")


@pytest.mark.parametrize("parameters", [None, {}, {"type": "object"}, {"type": "object", "properties": {"a": {"type": "string"}}}, {"properties": {}}])
def test_object_schemas_and_none_are_accepted(parameters: Any) -> None:
    function: dict[str, Any] = {"name": "f"} if parameters is None else {"name": "f", "parameters": parameters}
    req = _parse(tools=[{"type": "function", "function": function}], tool_choice="required")
    assert [t["name"] for t in req.tools] == ["f"]


def test_what_a_forced_call_of_a_string_schema_gave_was_no_call() -> None:
    """The consequence, which the refusal spares the client: the forced call is text."""
    grammar = tool_grammar([{"name": "f", "parameters": {"type": "string"}}], {"name": "f"}, True)
    assert grammar is not None and "call-arguments ::= string" in grammar
    reply = Reply("chat", "m", tools=[{"name": "f"}], tool_choice={"name": "f"})
    reply.add(Delta("j", '<tool_call>\n{"name": "f", "arguments": "x"}\n</tool_call>'))
    message = reply.body(Done("j", "stop"), None)["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"].startswith("<tool_call>")
