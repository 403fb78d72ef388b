"""The NumPy sampler chain (the MLX engine's) against llama.cpp's rules, on hand-made logits."""

from __future__ import annotations

import numpy as np

from scheduler.core.types import SamplingParams
from scheduler.engines.sampling import PENALTY_LAST_N, LaneSampler

LOGITS = np.array([1.0, 3.0, 2.5, -1.0, 0.5], dtype=np.float32)


def test_temperature_zero_is_argmax_and_accepts_the_token() -> None:
    sampler = LaneSampler(SamplingParams(temperature=0.0))
    assert sampler.sample(LOGITS) == 1
    assert list(sampler.recent) == [1]


def test_penalties_follow_llama_cpp_for_positive_and_negative_logits() -> None:
    sp = SamplingParams(temperature=0.0, repeat_penalty=2.0, frequency_penalty=0.25, presence_penalty=0.5)
    sampler = LaneSampler(sp, history=[1, 1, 3])
    expected = LOGITS.copy()
    expected[1] = 3.0 / 2.0 - 2 * 0.25 - 0.5  # positive: divided, then count 2
    expected[3] = -1.0 * 2.0 - 1 * 0.25 - 0.5  # negative: multiplied, then count 1
    assert np.allclose(sampler.penalise(LOGITS), expected)
    assert sampler.sample(LOGITS) == 2


def test_penalties_see_only_the_last_64_tokens() -> None:
    sampler = LaneSampler(SamplingParams(temperature=0.0, repeat_penalty=10.0), history=[1] + [4] * PENALTY_LAST_N)
    assert 1 not in sampler.recent
    assert sampler.sample(LOGITS) == 1


def test_top_k_one_is_greedy_at_any_temperature() -> None:
    sampler = LaneSampler(SamplingParams(temperature=5.0, top_k=1, seed=3))
    assert {sampler.sample(LOGITS) for _ in range(20)} == {1}


def test_top_p_keeps_the_token_that_crosses_p_and_min_p_drops_the_unlikely() -> None:
    probs = np.exp(LOGITS - LOGITS.max()) / np.exp(LOGITS - LOGITS.max()).sum()
    assert probs[1] < 0.6 < probs[1] + probs[2]
    top_p = LaneSampler(SamplingParams(temperature=1.0, top_p=0.6, seed=1))
    assert {top_p.sample(LOGITS) for _ in range(200)} == {1, 2}
    # min_p 0.5: keep logits within log(0.5) of the best: 3.0 and 2.5
    min_p = LaneSampler(SamplingParams(temperature=1.0, min_p=0.5, seed=1))
    assert {min_p.sample(LOGITS) for _ in range(200)} == {1, 2}


def test_a_seed_repeats_its_draws_and_no_seed_varies() -> None:
    hot = SamplingParams(temperature=2.0, seed=42)
    a, b = LaneSampler(hot), LaneSampler(hot)
    assert [a.sample(LOGITS) for _ in range(50)] == [b.sample(LOGITS) for _ in range(50)]
    unseeded = [LaneSampler(SamplingParams(temperature=2.0)) for _ in range(3)]
    assert len({tuple(s.sample(LOGITS) for _ in range(30)) for s in unseeded}) > 1
