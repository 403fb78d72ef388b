"""``n_predict: 0`` on llama-server's ``POST /completion``: llama.vim and llama.vscode send it to
warm the prompt cache. llama-server samples one token before it checks the budget (its
process_token: the limit is checked once ``n_gen > 0``), so one token comes back, and its
``generation_settings`` echo the request's parameters as given (server-task.cpp's
``params.to_json()``): ``n_predict`` and ``max_tokens`` 0.

Seen: the reply's ``generation_settings`` said ``n_predict: 1``, a limit the client never asked
for, where llama-server says 0."""

from __future__ import annotations

import json

import pytest

from tests.edge.inproc import JSON, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("stream", [False, True])
async def test_n_predict_zero_is_echoed_as_zero_with_its_one_token(stream: bool) -> None:
    body = json.dumps({"prompt": "Once upon a time", "n_predict": 0, "stream": stream}).encode()
    async with attached(SimWorker()):
        reply = await request("POST", "/completion", body, JSON)
    assert reply.status == 200, reply.body
    final = json.loads(reply.sse_data()[-1]) if stream else reply.json()
    assert final["tokens_predicted"] == 1 and final["stop_type"] == "limit"  # one token, as llama-server
    settings = final["generation_settings"]
    assert (settings["n_predict"], settings["max_tokens"]) == (0, 0), settings


async def test_other_limits_are_echoed_as_they_were() -> None:
    async with attached(SimWorker()):
        given = (await request("POST", "/completion", json.dumps({"prompt": "a", "n_predict": 3}).encode(), JSON)).json()
        none = (await request("POST", "/completion", json.dumps({"prompt": "a", "n_predict": -1, "stop": ["\n"]}).encode(), JSON)).json()
    assert given["generation_settings"]["n_predict"] == 3 and given["tokens_predicted"] == 3
    assert none["generation_settings"]["n_predict"] == -1
