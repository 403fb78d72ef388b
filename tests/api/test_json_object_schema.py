"""llama-server's JSON mode with a schema, ``response_format: {"type": "json_object", "schema":
{...}}`` (llama.cpp's, llama-cpp-python's and Together's spelling, read by llama-server's
``oaicompat`` parser): the schema constrains the reply, as there, rather than being dropped
silently for "any JSON object"."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.errors import ApiError
from api.schemas import GenerationRequest, parse_chat_request, parse_completion_request

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def parse(endpoint: str, **body: Any) -> GenerationRequest:
    if endpoint == "chat":
        raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}).encode()
        return parse_chat_request(raw, models={"m"}, strict=True)
    return parse_completion_request(json.dumps({"model": "m", "prompt": "hi", **body}).encode(), models={"m"}, strict=True)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_json_object_format_with_a_schema_is_constrained_to_the_schema(endpoint: str) -> None:
    req = parse(endpoint, response_format={"type": "json_object", "schema": SCHEMA})
    assert req.response_format == {"type": "json_schema", "schema": SCHEMA, "strict": True}


@pytest.mark.parametrize("schema", [None, {}])
def test_a_json_object_format_without_a_schema_is_any_json_object(schema: Any) -> None:
    assert parse("chat", response_format={"type": "json_object", "schema": schema}).response_format == {"type": "json_object"}


@pytest.mark.parametrize("schema", [3, "x", False])
def test_a_json_object_formats_schema_that_is_no_schema_is_a_400_naming_it(schema: Any) -> None:
    with pytest.raises(ApiError) as err:
        parse("chat", response_format={"type": "json_object", "schema": schema})
    assert err.value.status == 400 and err.value.param == "response_format.schema"
