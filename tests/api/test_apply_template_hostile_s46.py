"""Hostile bodies on llama-server's ``POST /apply-template``: every one is rendered or refused
with an error object (a 400 naming the parameter); none is a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.edge.inproc import JSON, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)

HI = {"role": "user", "content": "hi"}
DEEP = "[" * 5000 + "]" * 5000


def _deep(n: int) -> Any:
    value: Any = {}
    for _ in range(n):
        value = {"a": value}
    return value


CASES = [
    {"messages": [HI, {"role": "assistant", "content": None, "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": DEEP}}]}, {"role": "tool", "tool_call_id": "x", "content": "1"}]},
    {"messages": [HI, {"role": "assistant", "content": None, "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": json.dumps(_deep(900))}}]}, {"role": "tool", "tool_call_id": "x", "content": "1"}]},
    {"messages": [HI], "tools": [{"type": "function", "function": {"name": "f", "parameters": _deep(900)}}]},
    {"messages": [HI], "chat_template_kwargs": {"x": _deep(900)}},
    {"messages": [HI], "chat_template_kwargs": {"date_string": {"a": 1}}},
    {"messages": [HI], "chat_template_kwargs": {"messages": 1, "tools": 2, "bos_token": 3, "add_generation_prompt": 4}},
    {"messages": [HI], "chat_template_kwargs": []},
    {"messages": [{"role": "system", "content": "s"}]},
    {"messages": [HI], "add_generation_prompt": None},
    {"messages": [HI], "add_generation_prompt": 1},
    {"messages": [HI], "reasoning_effort": {"a": 1}},
    {"messages": [HI], "model": ["a"]},
    {"messages": [HI], "tools": [{"type": "function", "function": {"name": "f" * 100_000}}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 1000}]},
    {"messages": {"role": "user"}},
]


async def test_hostile_bodies_are_rendered_or_400s_naming_a_param() -> None:
    async with attached(SimWorker()):
        for body in CASES:
            reply = await request("POST", "/apply-template", json.dumps(body).encode(), JSON)
            assert reply.status in (200, 400, 404), (reply.status, reply.body[:300], str(body)[:200])
            if reply.status != 200:
                assert reply.is_error_object() and reply.json()["error"]["param"], reply.body


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "user", "system", "assistant", "tool", "function", "x", "call_1"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["role", "content", "tool_calls", "tool_call_id", "name", "id", "type", "function", "arguments", "parameters", "text"]), inner, max_size=4),
    max_leaves=12,
)
_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "developer"])}, optional={"content": _JSON, "tool_calls": _JSON, "tool_call_id": _JSON, "name": _JSON})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(messages=st.lists(_MESSAGE, max_size=4), extra=st.dictionaries(st.sampled_from(["tools", "tool_choice", "chat_template_kwargs", "add_generation_prompt", "reasoning_effort", "functions"]), _JSON, max_size=2))
async def test_fuzz_apply_template_bodies_are_rendered_or_400s(messages: list[Any], extra: dict[str, Any]) -> None:
    async with attached(SimWorker()):
        reply = await request("POST", "/apply-template", json.dumps({"messages": messages, **extra}).encode(), JSON)
    assert reply.status in (200, 400), (reply.status, reply.body[:300])
    if reply.status == 400:
        assert reply.is_error_object() and reply.json()["error"]["param"], reply.body
