"""llama-server's ``POST /v1/responses/input_tokens`` (and ``/responses/input_tokens``): the
tokens of a Responses API body's input as the model reads it (instructions, tools and the chat
template included), nothing generated. In process, with the bundled model's vocabulary and
template, as /tokenize and /apply-template read them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.edge.inproc import JSON, SimWorker, attached, refused_count, request

pytestmark = pytest.mark.django_db(transaction=True)

TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
INPUT: list[Any] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
]


def post(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


async def test_the_count_is_the_rendered_chats_tokens() -> None:
    chat = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                         {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
            "tools": [{"type": "function", "function": TOOL}]}  # fmt: skip
    async with attached(SimWorker()):
        counted = await request("POST", "/v1/responses/input_tokens", post(input=INPUT, instructions="Be brief.", tools=[TOOL]), JSON)
        other = await request("POST", "/responses/input_tokens", post(input=INPUT, instructions="Be brief.", tools=[TOOL]), JSON)
        prompt = (await request("POST", "/apply-template", json.dumps(chat).encode(), JSON)).json()["prompt"]
        tokens = (await request("POST", "/tokenize", post(content=prompt, add_special=True, parse_special=True), JSON)).json()["tokens"]
    assert counted.status == 200, counted.body
    assert counted.json() == other.json() == {"object": "response.input_tokens", "input_tokens": len(tokens)}
    assert len(tokens) > 10


@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        ({}, 400, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": 7}]}]}, 400, "input[0].content[0].image_url"),
        ({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}, 400, "input[0].content"),
        ({"input": "hi", "tools": [{"type": "function", "name": "bad name"}]}, 400, "tools[0].name"),
        ({"input": "hi", "model": "nope"}, 404, "model"),
    ],
)
async def test_a_body_that_cannot_be_counted_is_an_error_naming_it(fields: dict[str, Any], status: int, param: str) -> None:
    assert (await refused_count("/v1/responses/input_tokens", fields, status))["param"] == param
