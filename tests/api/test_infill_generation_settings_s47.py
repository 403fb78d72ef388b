"""llama-server's ``/infill`` answers its final completion object with ``generation_settings``
(server-task.cpp's ``to_json_non_oaicompat``, the same object as ``/completion``'s), the
parameters as given: ``n_predict: 0`` (llama.vim's cache warm-up) is echoed 0, as on
``/completion``, though one token runs.

Seen: the /infill result had no ``generation_settings`` at all, so a client reading
``generation_settings.n_predict`` (as it reads /completion's) found nothing."""

from __future__ import annotations

import json

import pytest

from tests.api.test_infill import FimSimWorker
from tests.edge.inproc import JSON, attached, request

pytestmark = pytest.mark.django_db(transaction=True)


def body(**fields: object) -> bytes:
    return json.dumps({"input_prefix": "def f():\n    ", "input_suffix": "\n", **fields}).encode()


@pytest.mark.parametrize("stream", [False, True])
async def test_n_predict_zero_is_echoed_as_zero_with_its_one_token(stream: bool) -> None:
    async with attached(FimSimWorker()):
        reply = await request("POST", "/infill", body(n_predict=0, stream=stream), JSON)
    assert reply.status == 200, reply.body
    final = json.loads(reply.sse_data()[-1]) if stream else reply.json()
    assert final["tokens_predicted"] == 1 and final["stop_type"] == "limit"
    settings = final["generation_settings"]
    assert (settings["n_predict"], settings["max_tokens"]) == (0, 0), settings


async def test_the_settings_are_those_it_ran_with_as_on_completion() -> None:
    async with attached(FimSimWorker()):
        given = (await request("POST", "/infill", body(n_predict=3, temperature=0.5, n_indent=2), JSON)).json()
        none = (await request("POST", "/infill", body(max_tokens=-1, stop=["\n"]), JSON)).json()
        picked = (await request("POST", "/infill", body(n_predict=0, response_fields=["generation_settings/n_predict"]), JSON)).json()
    settings = given["generation_settings"]
    assert (settings["n_predict"], settings["temperature"], settings["n_indent"], settings["top_k"]) == (3, 0.5, 2, 40)
    assert none["generation_settings"]["n_predict"] == -1 and none["generation_settings"]["stop"] == ["\n"]
    assert picked == {"generation_settings/n_predict": 0}
