"""``GET /slots``: llama-server's ``params`` on a busy lane (server-context.cpp's slot
``to_json``: ``ptask->params.to_json(only_metrics)``, the sampling settings its task runs with).
llama-server shows a slot's ``prompt`` and ``generated`` text only under
LLAMA_SERVER_SLOTS_DEBUG (``only_metrics`` otherwise); here never: a lane's text is its caller's.

Seen: no ``params`` on any lane, so a client reading a slot's temperature or n_predict found none."""

from __future__ import annotations

from tests.api.test_slots_id_task_s47 import slots_of
from tests.api.test_slots_next_token_new_line_s47 import lanes_after


async def test_a_busy_lane_has_the_params_its_job_samples_with() -> None:
    given = lanes_after({"max_tokens": 20, "temperature": 0.5, "top_k": 7, "seed": 41, "repeat_penalty": 1.1}, 2)
    free = lanes_after({}, 2)
    (out,) = await slots_of(given, free, {"lane": 2, "state": "idle"}, lane_ctx=64)
    params = out[0]["params"]
    assert (params["temperature"], params["top_k"], params["seed"], params["repeat_penalty"]) == (0.5, 7, 41, 1.1)
    assert (params["n_predict"], params["max_tokens"], params["ignore_eos"], params["n_probs"]) == (20, 20, False, 0)
    unlimited = out[1]["params"]
    assert (unlimited["n_predict"], unlimited["seed"]) == (-1, 4294967295)  # no limit; llama.cpp's default seed
    assert "params" not in out[2]  # an idle lane runs nothing


async def test_no_lane_shows_its_prompt_or_generated_text() -> None:
    (out,) = await slots_of(lanes_after({"max_tokens": 20}, 4), lane_ctx=64)
    assert "prompt" not in out[0] and isinstance(out[0]["generated"], int)
