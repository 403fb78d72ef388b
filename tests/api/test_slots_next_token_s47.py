"""``GET /slots``: ``next_token`` in llama-server's shape, an array of one object
(server-context.cpp: ``json::array({{has_next_token, has_new_line, n_remain, n_decoded}})``),
which a typed client (a struct with a list field) decodes; ``n_remain`` the tokens the job may
still generate (-1 on an idle lane).

Seen: ``"next_token": {"has_next_token": true, "n_decoded": 5}``, an object where llama-server
sends ``[{...}]``, so a client written against llama-server failed to decode our lanes."""

from __future__ import annotations

from tests.api.test_slots_id_task_s47 import slots_of
from tests.core.builders import make_job, make_scheduler, tick


async def test_next_token_is_an_array_of_one_object_as_llama_servers() -> None:
    (out,) = await slots_of(
        {"lane": 0, "state": "decode", "job_id": "a", "generated": 5, "max_tokens": 16},
        {"lane": 1, "state": "prefill", "job_id": "b", "max_tokens": 4},
        {"lane": 2, "state": "idle"},
        {"lane": 3, "state": "decode", "job_id": "c", "generated": 2},  # an older worker's: no limit said
    )  # fmt: skip
    tokens = [lane["next_token"] for lane in out]
    assert all(isinstance(t, list) and len(t) == 1 for t in tokens), tokens
    assert [(t[0]["has_next_token"], t[0]["n_decoded"], t[0]["n_remain"]) for t in tokens] == [
        (True, 5, 11), (True, 0, 4), (False, 0, -1), (True, 2, -1),
    ]  # fmt: skip


def test_the_schedulers_snapshot_says_each_busy_lanes_limit() -> None:
    sched, engine, _ = make_scheduler(max_batch=2)
    sched.add(make_job(job_id="j", max_tokens=6))
    tick(sched, engine)
    lanes = sched.snapshot()["lanes"]
    assert isinstance(lanes, list)
    assert [(lane["job_id"], lane["max_tokens"]) for lane in lanes if lane["state"] != "idle"] == [("j", 6)]
