"""llama-server's ``n_cmpl`` on ``POST /infill`` (its /infill goes through the same
handle_completions_impl as /completion: ``n_cmpl`` results, an array), and each result's
``generation_settings.seed`` the seed it sampled with: server-task.h's ``add_child`` gives the
j-th child task ``seed + j`` (the default seed, 4294967295, stays random and is echoed as is).

Seen: /infill named ``n_cmpl`` ignored and answered one completion; /completion's n_cmpl results
each echoed the request's seed, though result j sampled with seed + j."""

from __future__ import annotations

import json

import pytest

from api.schemas import parse_infill
from tests.api.test_infill import FimSimWorker
from tests.edge.inproc import JSON, MODEL, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)


def infill(**fields: object) -> bytes:
    return json.dumps({"input_prefix": "def f():\n    ", "input_suffix": "\n", "n_predict": 3, **fields}).encode()


def test_infill_reads_n_cmpl_then_n_and_names_neither_ignored() -> None:
    for fields, n in (({}, 1), ({"n_cmpl": 3}, 3), ({"n": 2}, 2), ({"n_cmpl": 3, "n": 2}, 3)):
        req, _ = parse_infill(infill(**fields), models=[MODEL])
        assert (req.n, req.ignored) == (n, []), fields


@pytest.mark.parametrize("stream", [False, True])
async def test_infill_n_cmpl_answers_an_array_each_with_its_seed(stream: bool) -> None:
    async with attached(FimSimWorker()):
        reply = await request("POST", "/infill", infill(n_cmpl=2, seed=41, stream=stream), JSON)
    assert reply.status == 200, reply.body
    if stream:
        frames = [json.loads(d) for d in reply.sse_data()]
        finals = sorted((f for f in frames if f["stop"]), key=lambda f: f["index"])
        assert {f["index"] for f in frames if not f["stop"]} <= {0, 1}
    else:
        finals = reply.json()
        assert isinstance(finals, list)
    assert [f["index"] for f in finals] == [0, 1]
    assert [f["generation_settings"]["seed"] for f in finals] == [41, 42]
    assert all(f["tokens_predicted"] == 3 for f in finals)


async def test_infill_without_n_cmpl_is_one_object() -> None:
    async with attached(FimSimWorker()):
        reply = await request("POST", "/infill", infill(seed=5), JSON)
    assert reply.status == 200 and isinstance(reply.json(), dict), reply.body
    assert reply.json()["generation_settings"]["seed"] == 5


@pytest.mark.parametrize(("seed", "expected"), [(7, [7, 8, 9, 7, 8, 9]), (None, [4294967295] * 6), (-1, [4294967295] * 6)])
async def test_completion_n_cmpl_results_echo_the_seed_each_sampled_with(seed: int | None, expected: list[int]) -> None:
    body = {"prompt": ["Once upon", "In a land"], "n_cmpl": 3, "n_predict": 2, **({"seed": seed} if seed is not None else {})}
    async with attached(SimWorker()):
        reply = await request("POST", "/completion", json.dumps(body).encode(), JSON)
    assert reply.status == 200, reply.body
    assert [f["generation_settings"]["seed"] for f in reply.json()] == expected
