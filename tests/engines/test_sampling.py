"""The NumPy sampler chain (the MLX engine's) against llama.cpp's rules, on hand-made logits."""

from __future__ import annotations

import numpy as np
import pytest

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


@pytest.mark.parametrize("temperature", [1e-310, 5e-324, 1e-300])
def test_a_temperature_too_small_to_divide_by_is_greedy_not_a_crash(temperature: float) -> None:
    # the API accepts any temperature in [0, 2]: the logits over 1e-310 overflowed to NaN, NumPy
    # raised, and the MLX worker died (and again for each resubmission)
    sampler = LaneSampler(SamplingParams(temperature=temperature, seed=1))
    assert {sampler.sample(LOGITS) for _ in range(5)} == {1}


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


def test_a_bias_of_minus_100_bans_a_token_and_a_positive_bias_lifts_one() -> None:
    banned = LaneSampler(SamplingParams(temperature=0.0, logit_bias=((1, -100.0),)))
    assert banned.sample(LOGITS) == 2
    lifted = LaneSampler(SamplingParams(temperature=0.0, logit_bias=((4, 3.0),)))
    assert lifted.sample(LOGITS) == 4


def test_ignore_eos_bans_every_end_of_generation_token() -> None:
    free = LaneSampler(SamplingParams(temperature=0.0), eog=[1, 2])
    assert free.sample(LOGITS) == 1
    hot = LaneSampler(SamplingParams(temperature=3.0, ignore_eos=True, seed=5), eog=[1, 2])
    assert {hot.sample(LOGITS) for _ in range(200)} <= {0, 3, 4}


class _OnlyOdd:
    """A grammar allowing odd token ids, remembering what it accepted."""

    def __init__(self) -> None:
        self.accepted: list[int] = []

    def allowed(self) -> np.ndarray:
        return np.arange(LOGITS.shape[0]) % 2 == 1

    def accept(self, token: int) -> None:
        self.accepted.append(token)


def test_the_grammar_masks_tokens_after_biases_and_sees_the_history_replayed() -> None:
    grammar = _OnlyOdd()
    sampler = LaneSampler(SamplingParams(temperature=0.0, logit_bias=((1, -100.0),)), history=[7, 9], grammar=grammar)
    assert grammar.accepted == [7, 9]  # a resumed lane's tokens, replayed
    assert sampler.sample(LOGITS) == 3  # 1 is banned, 2 is not allowed: the best odd one left
    hot = LaneSampler(SamplingParams(temperature=5.0, seed=2), grammar=_OnlyOdd())
    assert {hot.sample(LOGITS) for _ in range(100)} == {1, 3}


def test_a_grammar_that_allows_nothing_ends_the_reply_with_an_end_of_generation_token() -> None:
    class Nothing(_OnlyOdd):
        def allowed(self) -> np.ndarray:
            return np.zeros(LOGITS.shape[0], dtype=bool)

    assert LaneSampler(SamplingParams(temperature=1.0, seed=1), grammar=Nothing(), eog=[4]).sample(LOGITS) == 4


def test_typical_p_keeps_the_tokens_nearest_the_entropy() -> None:
    # a tiny typical_p keeps one token: the one whose surprise is nearest the entropy, not the likeliest
    probs = np.exp(LOGITS - LOGITS.max()) / np.exp(LOGITS - LOGITS.max()).sum()
    entropy = -(probs * np.log(probs)).sum()
    typical = int(np.argmin(np.abs(-np.log(probs) - entropy)))
    assert typical != int(np.argmax(LOGITS))
    sampler = LaneSampler(SamplingParams(temperature=1.0, typical_p=0.01, seed=4))
    assert {sampler.sample(LOGITS) for _ in range(50)} == {typical}


def test_logprobs_come_from_the_raw_logits_before_biases_and_penalties() -> None:
    sampler = LaneSampler(SamplingParams(temperature=0.0, logprobs=2, logit_bias=((1, -100.0),)))
    token = sampler.sample(LOGITS)
    logz = np.log(np.exp(LOGITS.astype(np.float64)).sum())
    assert sampler.last_logprobs is not None
    logprob, top = sampler.last_logprobs
    assert token == 2 and logprob == pytest.approx(LOGITS[2] - logz)
    assert [t for t, _ in top] == [1, 2] and top[0][1] == pytest.approx(LOGITS[1] - logz)
    assert LaneSampler(SamplingParams(temperature=0.0)).last_logprobs is None
