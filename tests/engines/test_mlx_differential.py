"""Differential KV-cache tests on the real MLX engine (SmolLM2-135M as float32, on the CPU
backend): the net of tests/engines/test_kv_differential.py for llama.cpp, on MLX. The real
scheduler plans ticks for a mix of greedy and seeded requests whose prompts share prefixes
with each other (the same prompt again, one identical but its last token, one longer by a
token, extensions, a half share), under schedule shapes Hypothesis draws (lanes, prefill budget
and step, parking on or off, lane moves, urgent arrivals that preempt, cancels, steps stopped
between calls, OS memory pressure at warning and critical with the occupancy watermarks on);
every request must get, token for token, what it gets alone in an empty lane. MLX batches the
decoding lanes' caches into one left-padded batch cache; with the system's OpenBLAS that rounds
the last bits otherwise than one lane alone (matrix shapes), so a greedy pick whose two best
logits are within 1e-3 of each other may differ, and only such a pick is let pass
(``test_a_batched_round_gives_each_lane_its_own_positions_and_kv``, ``same_or_a_tie``): any
other difference is the KV, its positions or the random stream.

MLX steps cannot be aborted mid-call (``abortable_steps`` is off); the scheduler's clock is a
fake one and the engine runs its ticks on it too, so the plans do not depend on this machine."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.kv_pool import PoolOps
from scheduler.core.qos import QosClass
from scheduler.core.scheduler import SchedulerConfig
from scheduler.core.types import LaneBind, LaneFeed, TickPlan
from scheduler.engines.base import Piece
from testkit.engine_driver import never, release

from .differential import (
    DRAWN_CANCELS,
    DRAWN_STOPS,
    GREEDY,
    Arrival,
    Harness,
    Net,
    arrivals,
    drawn_configs,
    make_family,
)
from .differential import config_of as shared_config

pytestmark = pytest.mark.model

N_LANES, SLOTS, LANE_CTX = 4, 2, 512
MAX_TOKENS = 6  # the longest reply compared


@pytest.fixture(scope="module")
def engine(mlx_float_dir: Path) -> Iterator[Any]:
    from scheduler.engines.mlx import MlxEngine

    eng = MlxEngine(mlx_float_dir, n_lanes=N_LANES, lane_ctx=LANE_CTX, cache_slots=SLOTS)
    with closing(eng):
        yield eng


def _empty(engine: Any) -> None:
    engine.execute(TickPlan(tick=0, release=list(range(N_LANES)), pool=PoolOps(drop=[N_LANES + i for i in range(SLOTS)])), never)


@pytest.fixture(scope="module")
def family(engine: Any) -> list[list[int]]:
    return make_family(engine)


class BetweenSteps(Harness):
    """MLX steps cannot be aborted mid-call: a tick stops between steps only."""

    def __init__(self, engine: Any, config: SchedulerConfig, stops: set[int], aborts: set[int]) -> None:
        assert not aborts, "an MLX step cannot be aborted"
        config.abortable_steps = False
        super().__init__(engine, config, stops)


def same_or_a_tie(engine: Any, prompt: list[int], got: list[int], want: list[int], seeded: bool, what: Any) -> None:
    """``got == want``, or a greedy pick where the two tokens' logits alone are so close (under
    1e-3) that another batch shape's rounding may order them otherwise (see the first test):
    the rest of the reply then follows another text and proves nothing either way."""
    if got == want:
        return
    assert len(got) == len(want) and not seeded, (what, got, want)
    i = next(k for k, (x, y) in enumerate(zip(got, want, strict=True)) if x != y)
    _empty(engine)
    row = engine._step([Piece(0, 0, list(prompt) + want[:i], True)])[0]
    _empty(engine)
    margin = abs(float(row[want[i]]) - float(row[got[i]]))
    assert margin < 1e-3, (what, i, margin, got, want)


# the clock moves on each tick: the critical hold on background (5 s) ends in finite ticks
run_schedule = Net(empty=_empty, max_tokens=MAX_TOKENS, harness=BetweenSteps, same=same_or_a_tie, tick_s=0.01).run


def config_of(lanes: int, budget: int, rate: float, park: bool, compact: bool, slots: int, tight: bool = False) -> SchedulerConfig:
    """``tight``: watermarks so low (6% and 3% of every lane's and slot's context) that cached
    prefixes are evicted to host memory at most ticks, and imported back for the next share."""
    return shared_config(lanes, budget, rate, park, compact, slots, lane_ctx=LANE_CTX, watermarks=(0.06, 0.03) if tight else (0.85, 0.70))


# -- the engine on its own -------------------------------------------------------------------


def test_a_batched_round_gives_each_lane_its_own_positions_and_kv(engine: Any, family: list[list[int]]) -> None:
    """The premise of the comparisons below: one decode round of lanes of different lengths,
    merged into a left-padded batch cache and split back out, leaves each lane its own prompt KV
    bit for bit, and its logits and new token's KV differ from those it gets alone only as much
    as lanes of equal lengths (no padding at all) do: the BLAS's rounding for another matrix
    shape (with the system's OpenBLAS, ~4e-5 here; with the BLAS bundled with mlx, nothing), not
    a position or a padding slot read as a token."""
    _empty(engine)
    base = family[0]

    def spread(prompts: list[list[int]]) -> list[tuple[float, float]]:
        alone = []
        for p in prompts:
            alone.append(_prefill_and_decode(engine, [(0, p)])[0])
            release(engine, 0)
        batched = _prefill_and_decode(engine, list(enumerate(prompts)))
        _empty(engine)
        out = []
        for lane, p in enumerate(prompts):
            (row_a, kv_a), (row_b, kv_b) = alone[lane], batched[lane]
            assert kv_a.n_tokens == kv_b.n_tokens == len(p) + 1
            new_kv = 0.0
            for (ka, va), (kb, vb) in zip(kv_a.layers, kv_b.layers, strict=True):
                assert np.array_equal(ka[..., :-1, :], kb[..., :-1, :]) and np.array_equal(va[..., :-1, :], vb[..., :-1, :])
                new_kv = max(new_kv, float(np.abs(ka - kb).max()), float(np.abs(va - vb).max()))
            assert int(row_a.argmax()) == int(row_b.argmax())
            out.append((float(np.abs(row_a - row_b).max()), new_kv))
        return out

    same = spread([base, base])
    mixed = spread([base, family[3], family[5]])
    for logits, new_kv in mixed:
        assert logits <= 4 * max(s[0] for s in same) + 1e-6 and logits < 1e-3
        assert new_kv <= 4 * max(s[1] for s in same) + 1e-7


def _prefill_and_decode(engine: Any, runs: list[tuple[int, list[int]]]) -> dict[int, tuple[Any, Any]]:
    """Prefill each (lane, prompt), then one decode round of all of them together with the
    greedy first tokens: each lane's logits of that round and its KV after it."""
    plan = TickPlan(tick=1, bind=[LaneBind(lane, f"r{lane}", GREEDY) for lane, _ in runs])
    plan.feeds = [LaneFeed(lane, f"r{lane}", 0, list(p), True) for lane, p in runs]
    first = engine.execute(plan, never)
    engine._step_logprobs.clear()
    pieces = [Piece(lane, len(p), [first.sampled[lane]], True) for lane, p in runs]
    rows = engine._step(pieces)
    return {lane: (rows[lane], engine.save(lane)) for lane, _ in runs}


# -- hand-made schedules ---------------------------------------------------------------------


@pytest.mark.parametrize("budget", [100])
def test_every_prefix_relation_served_from_kept_lanes_and_the_cache_replies_as_alone(
    engine: Any, family: list[list[int]], budget: int
) -> None:
    """One lane at a time: each prompt of the family meets the last one's kept KV (and the
    cached prefixes the pins left), chunked by the budget."""
    plan = [Arrival(i, p, 4, QosClass.AGENT, pin=(i % 2 == 0), seeded=(i % 3 == 0)) for i, p in enumerate([0, 0, 1, 2, 3, 4, 5, 1])]
    run_schedule(engine, family, config_of(1, budget, 64.0, True, False, SLOTS), plan)


@pytest.mark.parametrize("park", [True, False])
def test_preempted_requests_reply_as_alone(engine: Any, family: list[list[int]], park: bool) -> None:
    plan = [Arrival(0, 0, 6, QosClass.BACKGROUND, pin=False, seeded=True), Arrival(0, 3, 6, QosClass.BACKGROUND, pin=False)]
    plan += [Arrival(t, p, 4, QosClass.INTERACTIVE, pin=False) for t, p in ((3, 2), (4, 1), (9, 5))]
    counters = run_schedule(engine, family, config_of(2, 64, 64.0, park, False, SLOTS), plan)
    assert counters["preemptions"] >= 2
    assert (counters["parks"] > 0) == park


def test_stopped_steps_and_lane_moves_leave_nothing_stale(engine: Any, family: list[list[int]]) -> None:
    plan = [Arrival(0, p, 6, QosClass.AGENT, pin=False, seeded=(p == 3)) for p in (0, 3, 4)]
    plan += [Arrival(2, 2, 6, QosClass.AGENT, pin=False), Arrival(6, 1, 6, QosClass.AGENT, pin=False, seeded=True)]
    run_schedule(engine, family, config_of(3, 64, 64.0, True, True, SLOTS), plan, stops={1, 2, 3, 5, 7, 9, 12})


def test_cancelled_lanes_kept_and_reused_reply_as_alone(engine: Any, family: list[list[int]]) -> None:
    plan = [Arrival(0, 0, 6, QosClass.AGENT, pin=False), Arrival(0, 3, 6, QosClass.AGENT, pin=False)]
    plan += [Arrival(t, p, 6, QosClass.AGENT, pin=False) for t, p in ((3, 2), (3, 1), (5, 0), (5, 3))]
    run_schedule(engine, family, config_of(2, 64, 64.0, True, True, SLOTS), plan, cancels={2: 0, 4: 1, 6: 2})


def test_critical_pressure_drops_background_lanes_and_they_reply_as_alone(engine: Any, family: list[list[int]]) -> None:
    """Critical OS pressure preempts the decoding background lanes without parking (their KV
    dropped, recomputed later) and empties the kept lanes; a seeded one resumes its stream."""
    plan = [Arrival(0, p, 6, QosClass.BACKGROUND, pin=True, seeded=s) for p, s in ((0, True), (3, False), (4, True))]
    plan += [Arrival(1, 2, 5, QosClass.AGENT, pin=False)]
    counters = run_schedule(engine, family, config_of(4, 4096, 2000.0, True, False, SLOTS), plan, pressure={3: "critical"})
    assert counters["preemptions"] >= 1 and counters["parks"] == 0


def test_prefixes_evicted_to_host_memory_and_imported_back_reply_as_alone(engine: Any, family: list[list[int]]) -> None:
    plan = [Arrival(i // 2, p, 4, QosClass.AGENT, pin=(i % 3 == 0), seeded=(i % 2 == 1)) for i, p in enumerate([0, 3, 0, 2, 1, 4, 0, 3])]
    counters = run_schedule(engine, family, config_of(2, 100, 64.0, True, False, SLOTS, tight=True), plan)
    assert counters["evictions"] > 0 and counters["host_imports"] > 0, counters


# -- drawn schedules -------------------------------------------------------------------------


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    plan=st.lists(arrivals(MAX_TOKENS), min_size=1, max_size=7),
    # Watermarks off, or tight (see config_of): cached prefixes evicted to host memory and back.
    config=drawn_configs(N_LANES, SLOTS, lane_ctx=LANE_CTX, watermarks=[(0.85, 0.70), (0.06, 0.03)]),
    stops=DRAWN_STOPS,
    cancels=DRAWN_CANCELS,
    pressure=st.dictionaries(st.integers(0, 15), st.sampled_from(["warning", "critical"]), max_size=2),
)
def test_any_schedule_gives_every_request_the_reply_it_gets_alone(
    engine: Any, family: list[list[int]], plan: list[Arrival], config: SchedulerConfig, stops: set[int], cancels: dict[int, int], pressure: dict[int, str]
) -> None:
    run_schedule(engine, family, config, plan, stops=stops, cancels=cancels, pressure=pressure)
