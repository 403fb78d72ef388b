"""``GET /slots``: each lane has the fields llama-server's slot ``to_json`` always sends or sends
for a slot that ran a task (server-context.cpp): ``speculative`` (a boolean: no speculative
decoding here) and ``n_prompt_tokens``, ``n_prompt_tokens_processed`` (computed, not taken from
the prefix cache), ``n_prompt_tokens_cache`` (integers; 0 on an idle lane), which a client typed
against llama-server's slot decodes.

Seen: none of the four in our lanes, so such a client failed to decode them."""

from __future__ import annotations

from tests.api.test_slots_id_task_s47 import slots_of


async def test_lanes_have_llama_servers_speculative_and_prompt_counts() -> None:
    (out,) = await slots_of(
        {"lane": 0, "state": "decode", "job_id": "a", "prompt_tokens": 40, "prompt_done": 40, "cached_tokens": 32, "generated": 3},
        {"lane": 1, "state": "prefill", "job_id": "b", "prompt_tokens": 100, "prompt_done": 20, "cached_tokens": 0},
        {"lane": 2, "state": "idle"}
    )  # fmt: skip
    assert [lane["speculative"] for lane in out] == [False, False, False]
    counts = [(lane["n_prompt_tokens"], lane["n_prompt_tokens_processed"], lane["n_prompt_tokens_cache"]) for lane in out]
    assert counts == [(40, 8, 32), (100, 20, 0), (0, 0, 0)]
