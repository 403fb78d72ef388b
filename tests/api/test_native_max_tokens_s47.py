"""``max_tokens`` (and ``max_completion_tokens``) on llama-server's ``POST /completion`` (and
``/infill``): there they are aliases of ``n_predict`` (server-schema.cpp: ``n_predict`` with its
aliases, hard limits -1..INT32_MAX, ``n_predict`` itself read first), so ``max_tokens: 0`` is
``n_predict: 0`` (one token; /completion echoes 0) and ``max_tokens: -1`` is no limit.

Seen: ``max_tokens: 0`` (and -1) were 400 ``invalid_request_error`` ("an integer greater than
or equal to 1"), a request llama-server serves, while docs/api.md said ``max_tokens`` is read
as ``n_predict``."""

from __future__ import annotations

import json

import pytest

from api.schemas import parse_infill_request, parse_native_completion_request
from tests.edge.inproc import JSON, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)

MODELS = ["m"]


@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("stream", [False, True])
async def test_max_tokens_zero_is_n_predict_zero(name: str, stream: bool) -> None:
    body = json.dumps({"prompt": "Once upon a time", name: 0, "stream": stream}).encode()
    async with attached(SimWorker()):
        reply = await request("POST", "/completion", body, JSON)
    assert reply.status == 200, reply.body
    final = json.loads(reply.sse_data()[-1]) if stream else reply.json()
    assert final["tokens_predicted"] == 1 and final["stop_type"] == "limit"  # one token, as llama-server
    assert (final["generation_settings"]["n_predict"], final["generation_settings"]["max_tokens"]) == (0, 0)


def parse(**body: object) -> tuple[int | None, int | None]:
    req, options = parse_native_completion_request(json.dumps({"prompt": "a", **body}).encode(), models=MODELS)
    return req.max_tokens, options.n_predict


def test_the_aliases_read_as_n_predict_and_n_predict_wins() -> None:
    assert parse(max_tokens=0) == (1, 0)
    assert parse(max_tokens=-1) == (None, None)  # no limit, as n_predict -1
    assert parse(max_tokens=5) == (5, None)
    assert parse(max_tokens=5, n_predict=0) == (1, 0)  # llama-server reads n_predict first
    assert parse(max_tokens=0, n_predict=7) == (7, None)
    assert parse(max_tokens=0, n_predict=-1) == (None, None)
    assert parse(n_predict=0) == (1, 0)


async def test_below_minus_one_is_still_refused_naming_the_field() -> None:
    async with attached(SimWorker()):
        reply = await request("POST", "/completion", json.dumps({"prompt": "a", "max_tokens": -2}).encode(), JSON)
    assert reply.status == 400
    assert reply.json()["error"]["param"] == "max_tokens"


def test_infill_reads_its_limit_as_completion_does() -> None:
    """/infill takes llama-server's same schema: max_tokens 0 was a 400 there too."""

    def limit(**body: object) -> int | None:
        return parse_infill_request(json.dumps({"input_prefix": "a", **body}).encode(), models=MODELS)[0].max_tokens

    assert (limit(max_tokens=0), limit(max_completion_tokens=0), limit(max_tokens=-1)) == (1, 1, None)
    assert (limit(max_tokens=5, n_predict=2), limit(max_tokens=5, n_predict=-1), limit(max_tokens=5)) == (2, None, 5)
