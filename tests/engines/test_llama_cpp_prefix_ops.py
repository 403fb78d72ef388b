"""The llama.cpp engine's prefix-cache operations on the real model: copying a prefix between
sequences, storing it in a cache slot, evicting it to host memory and importing it back all
leave a lane whose greedy continuation equals that of a full prefill."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scheduler.core.kv_pool import PoolOps
from scheduler.core.types import LaneBind, LaneFeed, SamplingParams, TickPlan
from scheduler.engines.llama_cpp import LlamaCppEngine
from scheduler.engines.models import default_model_path

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0.0)
LANES, SLOTS = 2, 2
SLOT0 = LANES  # the first cache slot's sequence id


def never() -> bool:
    return False


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    eng = LlamaCppEngine(default_model_path(), n_lanes=LANES, lane_ctx=1024, cache_slots=SLOTS)
    try:
        yield eng
    finally:
        eng.close()


@pytest.fixture
def prompt(engine: LlamaCppEngine) -> list[int]:
    text = engine.render_chat(
        [
            {"role": "system", "content": "You answer questions about European geography in one sentence. " * 6},
            {"role": "user", "content": "What is the capital of France?"},
        ]
    )
    return engine.tokenize(text)


def clear(engine: LlamaCppEngine) -> None:
    engine.execute(TickPlan(tick=0, release=list(range(LANES)), pool=PoolOps(drop=[SLOT0, SLOT0 + 1])), never)


def continue_greedy(engine: LlamaCppEngine, lane: int, prompt: list[int], start: int, n: int = 12) -> list[int]:
    """Bind a greedy sampler, feed prompt[start:], then decode n tokens."""
    engine.execute(TickPlan(tick=0, bind=[LaneBind(lane, "j", GREEDY)]), never)
    out: list[int] = []
    pos, feed = start, prompt[start:]
    for _ in range(n):
        result = engine.execute(
            TickPlan(tick=0, feeds=[LaneFeed(lane, "j", pos, feed, True, decode=len(feed) == 1)]), never
        )
        token = result.sampled[lane]
        out.append(token)
        pos += len(feed)
        feed = [token]
    return out


def test_a_prefix_copied_from_another_lane_continues_like_a_full_prefill(engine: LlamaCppEngine, prompt: list[int]) -> None:
    clear(engine)
    reference = continue_greedy(engine, 0, prompt, 0)
    shared = len(prompt) - 9
    engine.execute(TickPlan(tick=0, pool=PoolOps(copy=[(0, 1, shared)])), never)
    assert continue_greedy(engine, 1, prompt, shared) == reference


def test_a_prefix_stored_evicted_to_host_and_imported_back_is_the_same_prefix(engine: LlamaCppEngine, prompt: list[int]) -> None:
    clear(engine)
    reference = continue_greedy(engine, 0, prompt, 0)
    shared = len(prompt) - 9
    engine.execute(TickPlan(tick=0, pool=PoolOps(store=[(0, SLOT0, shared)])), never)
    evicted = engine.execute(TickPlan(tick=0, release=[0], pool=PoolOps(evict=[(SLOT0, 7)])), never).evicted
    artifact = evicted[7]
    assert artifact.nbytes > 0 and artifact.n_tokens == shared
    engine.execute(TickPlan(tick=0, pool=PoolOps(imports=[(SLOT0 + 1, artifact)], copy=[(SLOT0 + 1, 1, shared)])), never)
    assert continue_greedy(engine, 1, prompt, shared) == reference


def test_a_shorter_share_of_a_longer_cached_prefix_keeps_only_the_shared_tokens(engine: LlamaCppEngine, prompt: list[int]) -> None:
    clear(engine)
    reference = continue_greedy(engine, 0, prompt, 0)
    engine.execute(TickPlan(tick=0, pool=PoolOps(store=[(0, SLOT0, len(prompt))])), never)
    engine.execute(TickPlan(tick=0, pool=PoolOps(copy=[(SLOT0, 1, 40)])), never)
    assert continue_greedy(engine, 1, prompt, 40) == reference
