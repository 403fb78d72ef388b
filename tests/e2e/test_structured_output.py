"""Structured output through the real server and model (llama.cpp's own GBNF parser and grammar
sampler): a schema with the keywords the converter used to drop or mangle gives replies that fit."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from tests.e2e.server import RunningServer, openai_client

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"
SCHEMA = {
    "type": "object",
    "properties": {
        "count": {"type": "integer", "minimum": 1000},
        "label": {"type": ["string", "null"], "enum": ['say "hi"', "C:\\temp", "two\nlines", None]},
        "owner": {
            "type": ["object", "null"],
            "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "maximum": -5}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
    },
    "required": ["count", "label", "owner"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_json_schema_with_bounds_nullable_types_and_escaped_enums_is_obeyed(shared_server: RunningServer, seed: int) -> None:
    """It was a grammar llama.cpp could not parse (the enum's quote), and without the enum the
    integer bounds and the nullable object's properties were not enforced."""
    reply = openai_client(shared_server.base).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe an inventory item with its owner as JSON."}],
        max_tokens=150,
        seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)


def test_anthropic_sdk_forced_tool_use_fits_its_schema_and_count_tokens_is_the_prompt(shared_server: RunningServer) -> None:
    """The real model through /v1/messages with the unmodified anthropic SDK: a forced tool_use
    (tool_choice ``tool``: the grammar writes it) comes back as a tool_use block whose input fits
    the tool's input_schema, streamed the same as not; count_tokens counts, with the real
    vocabulary, the prompt the worker prefilled (input_tokens plus those read from the cache)."""
    import anthropic

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}
    ask: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 80,
        "system": [{"type": "text", "text": "You are a weather assistant.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "What will the weather be in Paris for the next three days?"}],
        "tools": [{"name": "get_forecast", "description": "The forecast for a city.", "input_schema": schema}],
        "tool_choice": {"type": "tool", "name": "get_forecast"},
        "temperature": 0,
    }
    client = anthropic.Anthropic(base_url=shared_server.base, api_key="sk-unused", max_retries=0)
    message = client.messages.create(**ask)
    with client.messages.stream(**ask) as stream:
        streamed = stream.get_final_message()
    counted = client.messages.count_tokens(**{k: ask[k] for k in ("model", "system", "messages", "tools", "tool_choice")})
    for reply in (message, streamed):
        calls = [b for b in reply.content if b.type == "tool_use"]
        assert reply.stop_reason == "tool_use" and len(calls) == 1, reply
        assert calls[0].name == "get_forecast" and calls[0].id.startswith("toolu_")
        jsonschema.validate(calls[0].input, schema)
    assert streamed.content[-1].input == message.content[-1].input  # type: ignore[union-attr]
    assert counted.input_tokens == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
