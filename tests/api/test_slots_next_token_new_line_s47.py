"""``GET /slots``' ``next_token[0]`` as llama-server computes it (server-context.cpp's slot
``to_json``): ``has_new_line`` (the text generated so far holds a new line) and ``n_remain``
(``n_predict_max == -1 ? -1 : n_predict_max - n_gen``: -1 for a request that gave no limit).

Seen: ``has_new_line`` missing, and a request without a limit (``n_predict`` -1 or absent)
showing the context's room as its ``n_remain`` (e.g. 490) where llama-server shows -1."""

from __future__ import annotations

from typing import Any

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import Message, Submit
from scheduler.worker.loop import EngineWorker
from tests.api.test_slots_id_task_s47 import slots_of


class Written(SimEngine):
    """The simulated engine writing "ab\\ncd..." (a token a byte) after its prompt of one byte."""

    def tokenize(self, text: str, *, add_special: bool = True, special: bool = True, after: int | None = None) -> list[int]:
        return list(text.encode())

    def token_bytes(self, token: int) -> bytes:
        return bytes([token % 256])

    def next_token(self, sequence: list[int]) -> int:  # type: ignore[override]
        return b"ab\ncdefghijklmnopqrstuvwxyz"[len(sequence) - 1]


def lanes_after(request: dict[str, Any], ticks: int) -> dict[str, Any]:
    """The worker's snapshot of the request's lane after ``ticks`` ticks."""
    clock = FakeClock()
    engine = Written(n_lanes=1, lane_ctx=64, clock=clock, prefill_s_per_token=0.0)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=64), model_name="m", clock=clock)

    class Conn:
        def queue(self, message: Message) -> None:
            pass

    worker.handle(Conn(), Submit(id="j", request={"endpoint": "completions", "prompt": "x", "stop": [], **request}, qos=1))  # type: ignore[arg-type]
    for _ in range(ticks):
        worker.run_tick()
    (lane,) = [lane for lane in worker.snapshot()["lanes"] if lane.get("job_id") == "j"]
    return lane  # type: ignore[no-any-return]


async def view(*lanes: dict[str, Any]) -> list[dict[str, Any]]:
    (out,) = await slots_of(*lanes, lane_ctx=64)
    return [lane["next_token"][0] for lane in out]


async def test_a_request_without_a_limit_has_n_remain_minus_one_and_a_limited_one_its_count() -> None:
    unlimited = lanes_after({}, 2)
    limited = lanes_after({"max_tokens": 20}, 2)
    assert unlimited["generated"] == limited["generated"] > 0
    free, bounded = await view(unlimited, limited)
    assert free["n_remain"] == -1, free
    assert bounded["n_remain"] == 20 - limited["generated"], bounded


async def test_has_new_line_says_whether_the_text_so_far_holds_one() -> None:
    before, after = lanes_after({"max_tokens": 20}, 2), lanes_after({"max_tokens": 20}, 6)
    assert before["generated"] < 3 <= after["generated"]  # "ab" written, then "ab\ncd..."
    shown = await view(before, after)
    assert [t["has_new_line"] for t in shown] == [False, True], shown
    assert list(shown[0]) == ["has_next_token", "has_new_line", "n_remain", "n_decoded"]  # llama-server's keys, its order
