"""``GET /props`` typed as llama-server's (server-context.cpp's ``get_res_props``), for a client
that decodes it into a struct: ``modalities`` has llama-server's three flags (``vision``,
``video``, ``audio``), and ``default_generation_settings.params`` the limit and seed fields of
its ``task_params::to_json(true)`` (``n_predict``/``max_tokens`` -1: none; ``seed`` 4294967295,
llama.cpp's default seed; ``ignore_eos``, ``stream``, ``n_probs``), as an absent one is on
``/completion`` (its ``generation_settings`` say the same).

Seen: ``modalities`` without ``video`` and ``params`` without ``n_predict`` or ``seed``, where a
client typed against llama-server failed to decode the reply."""

from __future__ import annotations

import json

import pytest

from tests.edge.inproc import JSON, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)


async def test_props_has_llama_servers_modalities_and_default_limit_fields() -> None:
    async with attached(SimWorker()):
        props = (await request("GET", "/props")).json()
        native = (await request("POST", "/completion", json.dumps({"prompt": "a", "stop": ["\n"]}).encode(), JSON)).json()
    assert props["modalities"] == {"vision": False, "video": False, "audio": False}
    params = props["default_generation_settings"]["params"]
    ran = native["generation_settings"]  # what a request leaving them out ran with
    for name in ("n_predict", "max_tokens", "seed", "ignore_eos", "stream", "n_probs"):
        assert params[name] == ran[name], name
    assert (params["n_predict"], params["seed"]) == (-1, 4294967295)
