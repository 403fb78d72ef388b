"""Structured output through the real server and model (llama.cpp's own GBNF parser and grammar
sampler): a schema with the keywords the converter used to drop or mangle gives replies that fit."""

from __future__ import annotations

import json

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
