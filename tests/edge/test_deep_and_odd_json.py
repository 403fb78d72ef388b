"""Deeply nested or odd JSON anywhere a client can put it (a string-form schema, a schema object,
llama-server's /tokenize and /detokenize) is a 400 with an OpenAI error object, never a 500,
and leaves the server serving the next request."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .inproc import JSON, MODEL, SimWorker, attached, chat_body, request

pytestmark = pytest.mark.django_db(transaction=True)


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}

CASES = [
    ("/v1/chat/completions", json.dumps({**CHAT, "guided_json": "[" * 5000}).encode()),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "json_schema": "{" * 5000}).encode()),
    ("/v1/chat/completions", json.dumps({**CHAT, "guided_json": '{"type": "string", "enum": ["a\\ud800"]}'}).encode()),
    ("/v1/chat/completions", json.dumps({**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "deep", "schema": nested(600)}}}).encode()),
    ("/tokenize", b"[" * 100_000),
    ("/tokenize", b'{"content": "a\\ud800"}'),
    ("/detokenize", b"[" * 100_000),
]


@pytest.mark.parametrize(("path", "body"), CASES, ids=["schema-string-deep", "completions-schema-string-deep", "schema-string-surrogate", "schema-object-deep", "tokenize-deep", "tokenize-surrogate", "detokenize-deep"])
async def test_deep_or_odd_json_is_a_400_and_the_next_request_is_served(sim: SimWorker, path: str, body: bytes) -> None:
    async with attached(sim):
        reply = await request("POST", path, body, JSON)
        assert reply.status == 400, (reply.status, reply.body[:300])
        error = json.loads(reply.body)["error"]
        assert error["type"] == "invalid_request_error" and error["message"], error
        assert (await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON)).status == 200
