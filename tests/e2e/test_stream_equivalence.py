"""Streamed and non-streamed replies of the real model are the same reply.

Fixed requests, greedy (``temperature: 0``) or seeded, each asked plainly and then streamed
(raw SSE through httpx): the stream's framing is checked and the reply it adds up to compared
with the plain one, with the helpers of tests/edge/test_stream_equivalence.py (which
draws many such requests on the simulated engine). Log-probabilities are compared to a
tolerance: the streamed twin finds its prompt in the prefix cache, and a prefill of fewer
tokens may round the last digits differently; the tokens and the text must be the same.
"""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest

from tests.edge.test_stream_equivalence import _usage, assemble, whole

from .server import RunningServer

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"
ASK = [{"role": "user", "content": "Name three colours of the rainbow, one a line."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CITY = {"type": "json_schema", "json_schema": {"name": "city", "strict": True, "schema": {
    "type": "object", "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["name", "population"], "additionalProperties": False}}}  # fmt: skip

CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("chat-greedy-logprobs", "/v1/chat/completions",
     {"messages": ASK, "temperature": 0, "max_tokens": 24, "logprobs": True, "top_logprobs": 2}),
    ("chat-seed-n2-stop", "/v1/chat/completions",
     {"messages": ASK, "temperature": 0.9, "seed": 1234, "n": 2, "max_tokens": 40, "stop": ["\n", "ue"]}),
    ("chat-required-tool", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "temperature": 0,
      "max_tokens": 100, "tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}),
    ("chat-named-tool-seed", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Weather in Rome and Oslo?"}], "temperature": 0.7, "seed": 5,
      "max_tokens": 60, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    ("chat-json-schema", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Describe Paris as JSON."}], "temperature": 0, "max_tokens": 48,
      "response_format": CITY}),
    ("completions-echo-logprobs", "/v1/completions",
     {"prompt": "The capital of France is", "temperature": 0, "max_tokens": 12, "echo": True, "logprobs": 2}),
    ("completions-seed-n2-stop", "/v1/completions",
     {"prompt": ["Once upon a time", "The best way to cook rice"], "temperature": 1.0, "seed": 99, "n": 2,
      "max_tokens": 20, "stop": [" the", "."]}),
]  # fmt: skip


def _close(a: Any, b: Any) -> bool:
    """Equal, but floats to a tolerance (logprobs)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-3)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.mark.parametrize(("path", "body"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_streamed_reply_of_the_model_is_the_plain_reply(server: RunningServer, path: str, body: dict[str, Any]) -> None:
    body = {"model": MODEL, **body}
    chat = path.endswith("chat/completions")
    logprobs = "logprobs" in body
    plain = httpx.post(server.base + path, json=body, timeout=300)
    assert plain.status_code == 200, plain.text
    twin = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.base + path, json=twin, timeout=300) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    got, error = assemble(data, chat, True, logprobs)
    assert error is None, error
    want = whole(plain.json(), chat, logprobs)
    assert got["model"] == want["model"]
    assert got["usage"] == _usage(plain.json()["usage"]) and got["usage"] is not None
    assert sorted(got["choices"]) == sorted(want["choices"]) == list(range(len(want["choices"])))
    for i, w in want["choices"].items():
        g = got["choices"][i]
        assert (g["text"], g["finish_reason"]) == (w["text"], w["finish_reason"]), (i, g, w)
        assert g.get("calls") == w.get("calls"), (i, g, w)
        assert _close(g["logprobs"], w["logprobs"]), (i, json.dumps(g["logprobs"])[:600], json.dumps(w["logprobs"])[:600])
    if "tool_choice" in body:  # forced: the reply is calls whose arguments parse
        assert all(w["calls"] and w["finish_reason"] == "tool_calls" for w in want["choices"].values()), want
        assert all(isinstance(json.loads(args), dict) for w in want["choices"].values() for _, args in w["calls"])
    if "response_format" in body:
        assert all(isinstance(json.loads(w["text"]), dict) for w in want["choices"].values() if w["finish_reason"] == "stop")
