"""Generation parameters built against the shared engine worker, on the real server and model:
each is a clean 400 (or is served) and the worker goes on serving everyone else."""

from __future__ import annotations

import json

import httpx
import pytest

from .server import RunningServer

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"


def _restarts(server: RunningServer) -> int:
    return int(server.health()["worker_restarts"])


def _refused_and_the_worker_serves_on(server: RunningServer, grammar: str, why: str) -> None:
    """``grammar`` is a 400 naming response_format (its message says ``why``), and the same worker
    then answers a plain request."""
    restarts = _restarts(server)
    r = httpx.post(server.base + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3, "grammar": grammar}, timeout=120)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_value" and error["param"] == "response_format" and why in error["message"]
    ok = httpx.post(server.base + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3}, timeout=120)
    assert ok.status_code == 200 and _restarts(server) == restarts


def test_a_grammar_whose_repetitions_explode_is_400_and_the_worker_serves_on(shared_server: RunningServer) -> None:
    """A 5,000-character literal repeated 2,000 times is 10M grammar elements that llama.cpp's
    parser writes out (twice: the check and the lane's sampler); a 1 MiB one would need ~16 GB."""
    _refused_and_the_worker_serves_on(shared_server, 'root ::= "' + "a" * 5000 + '"{2000}', "expand")


def test_a_grammar_whose_rules_start_in_too_many_ways_is_400_and_the_worker_serves_on(shared_server: RunningServer) -> None:
    """900 rules, each two optional references to the next (20 KB): llama.cpp's grammar set-up
    explored every way to start, for good; the worker stopped serving everyone, and /health still
    said ok. The count is made before llama.cpp sees it."""
    grammar = "root ::= r0\n" + "\n".join(f"r{i} ::= r{i + 1}? r{i + 1}?" for i in range(900)) + '\nr900 ::= "a"'
    _refused_and_the_worker_serves_on(shared_server, grammar, "ways")


def test_a_schema_with_many_optional_properties_is_served(shared_server: RunningServer) -> None:
    """Three objects of 900 optional properties (84 KB): the converter's rules come out the same,
    in linear work (tests/api/test_hostile_params.py counts it), and the reply fits them."""
    schema = {
        "type": "object",
        "properties": {f"o{j}": {"type": "object", "properties": {f"p{j}_{i}": {"type": "integer"} for i in range(900)}} for j in range(3)},
        "additionalProperties": False,
    }
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Reply in JSON."}],
        "max_tokens": 40,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "wide", "schema": schema}},
    }
    r = httpx.post(shared_server.base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["message"]["content"]
    assert text.startswith("{")
    if r.json()["choices"][0]["finish_reason"] == "stop":
        assert set(json.loads(text)) <= {"o0", "o1", "o2"}
