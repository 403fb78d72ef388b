"""llama-server's ``n_probs`` on ``POST /completion`` has the alias ``logprobs``, read where
``n_probs`` is absent (server-schema.cpp: ``add_alias("logprobs") // use "logprobs" if "n_probs"
wasn't provided``; a JSON boolean reads as 1 or 0 there), so a client that sends OpenAI's name
gets ``completion_probabilities``.

Seen: ``logprobs: 2`` on /completion was named ignored and the reply had no probabilities."""

from __future__ import annotations

import json

import pytest

from api.errors import ApiError
from api.schemas import parse_native_completion_request
from tests.api.test_native_completion_s46 import LogprobWorker, body
from tests.edge.inproc import JSON, MODEL, attached, request


def parse(**fields: object) -> tuple[int | None, list[str]]:
    req, _ = parse_native_completion_request(json.dumps({"prompt": "a", **fields}).encode(), models=[MODEL])
    return req.logprobs, req.ignored


def test_logprobs_is_n_probs_where_n_probs_is_absent() -> None:
    assert parse(logprobs=3) == (3, [])
    assert parse(logprobs=True) == (1, []) and parse(logprobs=False) == (None, [])
    assert parse(n_probs=2, logprobs=5) == (2, [])
    assert parse(n_probs=None, logprobs=4) == (4, [])


def test_a_bad_logprobs_is_a_400_naming_it() -> None:
    for value in (21, -1, "2", 1.5):
        with pytest.raises(ApiError) as err:
            parse(logprobs=value)
        assert err.value.status == 400 and err.value.param == "logprobs"


@pytest.mark.django_db(transaction=True)
async def test_logprobs_gives_completion_probabilities_as_n_probs_does() -> None:
    async with attached(LogprobWorker()):
        alias = await request("POST", "/completion", body(logprobs=2), JSON)
        own = await request("POST", "/completion", body(n_probs=2), JSON)
    assert alias.status == 200, alias.body
    assert alias.json()["completion_probabilities"] == own.json()["completion_probabilities"]
    assert alias.json()["generation_settings"]["n_probs"] == 2 and "x-superfluid-ignored-params" not in alias.headers
