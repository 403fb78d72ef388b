"""llama-server's ``n_cmpl`` on ``POST /completion`` (server-schema.cpp: completions per prompt,
1..n_parallel, with ``n`` its alias where it is absent; server-context.cpp gives each prompt's
task ``n_cmpl - 1`` children, indexed prompt by prompt, and answers an array of every result).

Seen: ``n_cmpl: 2`` (or ``n: 2``) answered one completion object, ``n_cmpl`` named ignored,
where llama-server answers an array of two."""

from __future__ import annotations

import json

import pytest

from api.errors import ApiError
from api.schemas import parse_native_completion_request
from tests.edge.inproc import JSON, MODEL, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)


def parse(**body: object) -> tuple[int, list[str]]:
    req, _ = parse_native_completion_request(json.dumps({"prompt": "a", **body}).encode(), models=[MODEL])
    return req.n, req.ignored


def test_n_cmpl_then_n_is_read_and_not_named_ignored() -> None:
    assert parse() == (1, [])
    assert parse(n_cmpl=3) == (3, [])
    assert parse(n=2) == (2, [])
    assert parse(n_cmpl=3, n=2) == (3, [])  # n only where n_cmpl is absent


@pytest.mark.parametrize("body", [{"n_cmpl": 0}, {"n": 0}, {"n_cmpl": "2"}, {"n_cmpl": 17}, {"prompt": ["a", "b", "c"], "n_cmpl": 11}])
def test_a_count_out_of_bounds_is_a_400_naming_it(body: dict[str, object]) -> None:
    with pytest.raises(ApiError) as err:
        parse(**body)
    assert err.value.status == 400 and err.value.param == next(k for k in body if k != "prompt")


@pytest.mark.parametrize("stream", [False, True])
async def test_two_prompts_times_n_cmpl_answer_an_array_prompt_by_prompt(stream: bool) -> None:
    body = {"prompt": ["Once upon", "In a land"], "n_cmpl": 2, "n_predict": 3, "seed": 7, "stream": stream}
    async with attached(SimWorker()):
        reply = await request("POST", "/completion", json.dumps(body).encode(), JSON)
        alone = [(await request("POST", "/completion", json.dumps({"prompt": p, "n_predict": 3}).encode(), JSON)).json() for p in body["prompt"]]  # type: ignore[union-attr]
    assert reply.status == 200, reply.body
    if stream:
        frames = [json.loads(d) for d in reply.sse_data()]
        finals = sorted((f for f in frames if f["stop"]), key=lambda f: f["index"])
        texts = {i: "".join(f["content"] for f in frames if f["index"] == i) for i in range(4)}
    else:
        finals = reply.json()
        assert isinstance(finals, list)
        texts = {f["index"]: f["content"] for f in finals}
    assert [f["index"] for f in finals] == [0, 1, 2, 3]
    assert [f["prompt"] for f in finals] == ["Once upon", "Once upon", "In a land", "In a land"]
    assert all(f["tokens_predicted"] == 3 for f in finals) and all(len(t) > 0 for t in texts.values())
    assert [f["tokens_evaluated"] for f in finals] == [alone[0]["tokens_evaluated"]] * 2 + [alone[1]["tokens_evaluated"]] * 2
