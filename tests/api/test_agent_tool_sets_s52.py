"""An agent's tool set (testkit/agent_tools.py) through the API, in-process, with one tool
whose schema no grammar can hold (a lookahead in a pattern): a forced call is a 400 that names
``tools`` and says why, before anything is generated; ``auto`` answers, its reply left free, as
llama-server leaves it where it cannot build its lazy grammar."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testkit.agent_tools import CLAUDE_CODE
from tests.edge.inproc import JSON, SimWorker, attached_loop, chat_body, request

LOOKAHEAD = {"name": "lookup", "description": "Look a word up.", "parameters": {"type": "object", "properties": {"word": {"type": "string", "pattern": "^(?!x)\\w+$"}}, "required": ["word"]}}
pytestmark = pytest.mark.django_db(transaction=True)

TOOLS = [{"type": "function", "function": tool} for tool in [*CLAUDE_CODE, LOOKAHEAD]]


def _chat(choice: Any) -> Any:
    with attached_loop(SimWorker(lane_ctx=1 << 16)) as loop:
        return loop.run_until_complete(request("POST", "/v1/chat/completions", chat_body(tools=TOOLS, tool_choice=choice, max_tokens=4), JSON))


def test_a_forced_call_of_a_set_with_an_unholdable_schema_is_a_400_naming_tools() -> None:
    for choice in ("required", {"type": "function", "function": {"name": "lookup"}}):
        reply = _chat(choice)
        assert reply.status == 400, reply.body
        error = reply.json()["error"]
        assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_value", "tools"), error
        assert "cannot be enforced" in error["message"] and "pattern" in error["message"], error


def test_auto_with_such_a_set_answers_free() -> None:
    reply = _chat("auto")
    assert reply.status == 200, reply.body
    assert json.loads(reply.body)["choices"][0]["finish_reason"] in ("length", "stop")
