"""run_tick, the one order of a tick's operations, over a recording engine: what runs in which
order, what an out-of-range sequence does, and the partial result a failed step carries."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.kv_pool import PoolOps
from scheduler.core.types import LaneBind, LaneFeed, LaneRestore, SamplingParams, TickPlan
from scheduler.engines.base import EngineError, Step, StepAborted, run_tick
from scheduler.engines.sim import SimEngine, SimParked


class Recording(SimEngine):
    """The simulator, noting each primitive it is asked for; ``fail_at`` makes that forward call
    (1-based) fail as llama.cpp does when the KV cache has no room."""

    def __init__(self, fail_at: int = 0, abort_at: int = 0, **kw: Any) -> None:
        super().__init__(**kw)
        self.log: list[str] = []
        self.fail_at = fail_at
        self.abort_at = abort_at  # that forward call is aborted (rolled back) as llama.cpp does
        self.forwards = 0

    def save(self, seq: int) -> SimParked:
        self.log.append(f"save {seq}")
        return super().save(seq)

    def load(self, seq: int, artifact: Any) -> None:
        self.log.append(f"load {seq}")
        super().load(seq, artifact)

    def clear(self, seq: int) -> None:
        self.log.append(f"clear {seq}")
        super().clear(seq)

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        self.log.append(f"copy {src}->{dst}")
        super().copy_prefix(src, dst, n_tokens)

    def bind_sampler(self, bind: LaneBind) -> None:
        self.log.append(f"bind {bind.lane}")
        super().bind_sampler(bind)

    def drop_sampler(self, lane: int) -> None:
        self.log.append(f"unbind {lane}")
        super().drop_sampler(lane)

    def forward(self, step: Step) -> dict[int, int]:
        self.forwards += 1
        if self.forwards == self.fail_at:
            raise EngineError("llama_decode returned 1", permanent=False)
        if self.forwards == self.abort_at:
            raise StepAborted("step aborted")
        self.log.append("forward " + ",".join(f"{p.lane}:{len(p.tokens)}" for p in step.pieces))
        return super().forward(step)


GREEDY = SamplingParams(temperature=0.0)


def test_a_tick_runs_pool_ops_then_lanes_then_imports_binds_and_decode_first_steps() -> None:
    engine = Recording(n_lanes=3, cache_slots=2)
    engine.kv[0] = [1, 2, 3, 4]  # lane 0: to store, then park
    engine.kv[1] = [5, 6]  # lane 1: to release
    engine.kv[3] = [7, 8, 9]  # slot 3: to evict
    engine.kv[2] = [1, 2]  # lane 2 decodes
    engine.lane_job[1], engine.lane_job[0], engine.lane_job[2] = "r", "p", "d"
    plan = TickPlan(
        tick=1,
        pool=PoolOps(evict=[(3, 11)], store=[(0, 4, 2)], imports=[(3, SimParked([9]))], copy=[(4, 1, 2)]),
        release=[1],
        park=[(0, "p")],
        restore=[LaneRestore(0, "q", SimParked([5, 5, 5]))],
        bind=[LaneBind(1, "new", GREEDY), LaneBind(0, "q", GREEDY)],
        feeds=[LaneFeed(1, "new", 2, [1, 2, 3, 4, 5], True), LaneFeed(2, "d", 2, [42], True, decode=True)],
        step_tokens=4,
    )
    result = run_tick(engine, plan, lambda: False, engine.clock)
    assert engine.log == [
        "save 3", "clear 3",  # evict
        "copy 0->4",  # store
        "clear 1", "unbind 1",  # release
        "save 0", "clear 0", "unbind 0",  # park
        "load 0",  # restore
        "load 3",  # import
        "copy 4->1",  # copy
        "bind 1", "bind 0",
        "forward 2:1,1:3", "forward 1:2",  # the decode token first, at most 4 tokens a step
    ]  # fmt: skip
    assert result.parked["p"].tokens == [1, 2, 3, 4] and result.evicted[11].tokens == [7, 8, 9]
    assert result.fed == {2: 1, 1: 5} and set(result.sampled) == {1, 2}
    assert engine.kv[1][:2] == [1, 2] and len(engine.kv[1]) == 7


def test_an_out_of_range_sequence_is_a_permanent_error_before_anything_runs() -> None:
    engine = Recording(n_lanes=2, cache_slots=1)
    with pytest.raises(EngineError, match="sequence 3 out of range") as info:
        run_tick(engine, TickPlan(tick=1, pool=PoolOps(drop=[3])), lambda: False, engine.clock)
    assert info.value.permanent and info.value.partial is None and engine.log == []
    with pytest.raises(EngineError, match="lane 2 out of range"):
        run_tick(engine, TickPlan(tick=1, release=[2]), lambda: False, engine.clock)


def test_a_failed_step_raises_with_what_the_earlier_steps_did() -> None:
    engine = Recording(fail_at=2, n_lanes=1)
    plan = TickPlan(tick=1, bind=[LaneBind(0, "a", GREEDY)], feeds=[LaneFeed(0, "a", 0, list(range(10)), True)], step_tokens=4)
    with pytest.raises(EngineError) as info:
        run_tick(engine, plan, lambda: False, engine.clock)
    partial = info.value.partial
    assert not info.value.permanent and partial is not None
    assert partial.fed == {0: 4} and partial.sampled == {}  # one step of four tokens got in
    assert len(engine.kv[0]) == 4 and partial.prefill_s > 0


def test_should_stop_is_asked_between_steps_and_the_tick_says_it_stopped() -> None:
    engine = Recording(n_lanes=1)
    plan = TickPlan(tick=1, bind=[LaneBind(0, "a", GREEDY)], feeds=[LaneFeed(0, "a", 0, list(range(10)), True)], step_tokens=4)
    result = run_tick(engine, plan, lambda: True, engine.clock)
    assert result.stopped_early and result.fed == {0: 4} and engine.forwards == 1


def test_an_aborted_step_ends_the_tick_with_what_the_earlier_steps_did() -> None:
    engine = Recording(abort_at=2, n_lanes=1)
    plan = TickPlan(tick=1, bind=[LaneBind(0, "a", GREEDY)], feeds=[LaneFeed(0, "a", 0, list(range(10)), True)], step_tokens=4)
    result = run_tick(engine, plan, lambda: False, engine.clock)
    # no error: the tick stopped early, the first step's four tokens in, the aborted one not
    assert result.stopped_early and result.fed == {0: 4} and result.sampled == {}
    assert len(engine.kv[0]) == 4 and engine.forwards == 2


class WithLogprobs(Recording):
    """A simulator that, like llama.cpp, computes logprobs in ``forward`` for lanes whose
    sampling asks for them and hands them over in ``take_logprobs``."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.wants: dict[int, int] = {}
        self.pending: dict[int, tuple[float, list[tuple[int, float]]]] = {}

    def bind_sampler(self, bind: LaneBind) -> None:
        super().bind_sampler(bind)
        if bind.sampling.logprobs is not None:
            self.wants[bind.lane] = bind.sampling.logprobs

    def forward(self, step: Step) -> dict[int, int]:
        sampled = super().forward(step)
        for lane, token in sampled.items():
            if lane in self.wants:
                self.pending[lane] = (-0.5, [(token, -0.5)][: self.wants[lane]])
        return sampled

    def take_logprobs(self) -> dict[int, tuple[float, list[tuple[int, float]]]]:
        taken, self.pending = self.pending, {}
        return taken


def test_logprobs_from_forward_reach_the_tick_result_for_the_lanes_that_asked_only() -> None:
    engine = WithLogprobs(n_lanes=2)
    plan = TickPlan(
        tick=1,
        bind=[LaneBind(0, "a", SamplingParams(temperature=0.0, logprobs=1)), LaneBind(1, "b", GREEDY)],
        feeds=[LaneFeed(0, "a", 0, [1, 2, 3], True), LaneFeed(1, "b", 0, [4, 5], True)],
    )
    result = run_tick(engine, plan, lambda: False, engine.clock)
    assert set(result.sampled) == {0, 1}
    assert result.logprobs == {0: (-0.5, [(result.sampled[0], -0.5)])}
    assert engine.pending == {}  # taken once: a later tick does not report them again
