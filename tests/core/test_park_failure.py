"""A park whose state save fails. docs/scheduling.md says a park that fails means a recompute of
the preempted job; on an engine whose save raises (llama.cpp: ``llama_state_seq_get_data``
writing nothing) the tick raised with no partial result and the worker failed every running job,
the urgent request that preempted included."""

from __future__ import annotations

from typing import Any

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.base import EngineError
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import Done, Error, Submit
from scheduler.worker.loop import EngineWorker
from tests.core.builders import RecordingConn, run_worker


class SaveFails(SimEngine):
    def save(self, seq: int) -> Any:
        if seq < self.n_lanes:  # a lane's state: a park (or a move)
            raise EngineError(f"could not copy lane {seq}'s KV cache", permanent=False)
        return super().save(seq)


def test_a_park_whose_save_fails_recomputes_the_victim_and_fails_no_other_job() -> None:
    clock = FakeClock()
    engine = SaveFails(n_lanes=2, lane_ctx=512, clock=clock)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=512), model_name="sim", clock=clock)
    conn = RecordingConn()
    agent = {"endpoint": "completions", "prompt": "an agent's prompt", "max_tokens": 30}
    worker.handle(conn, Submit("a", agent, qos=2))  # type: ignore[arg-type]
    worker.handle(conn, Submit("b", agent, qos=2))  # type: ignore[arg-type]
    for _ in range(6):
        worker.run_tick()
    worker.handle(conn, Submit("chat", {"endpoint": "completions", "prompt": "hello", "max_tokens": 3}, qos=0))  # type: ignore[arg-type]
    run_worker(worker, 500)
    errors = [m for m in conn.sent if isinstance(m, Error)]
    done = {m.id for m in conn.sent if isinstance(m, Done)}
    assert errors == []
    assert done == {"a", "b", "chat"}
