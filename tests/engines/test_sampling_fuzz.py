"""Fuzz: the per-lane sampler with any parameters api/schemas.py lets through (temperature 0-2,
top_p/typical_p in (0, 1], min_p 0-1, top_k >= 0, penalties -2..2, repeat_penalty > 0 unbounded,
logit_bias -100..100 on ids below 2**31, a 64-bit seed, 0-20 logprobs): a token inside the
vocabulary (and the grammar), never an exception or NaN, the same tokens for the same seed."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduler.core.types import SamplingParams
from scheduler.engines.sampling import LaneSampler, logprobs_of

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _positive(hi: float | None) -> st.SearchStrategy[float]:
    extremes = st.sampled_from([5e-324, 1e-300, 1e-45, 1e-39, 1e-7] + ([hi] if hi else [1e39, 1e300, 1.7e308]))
    return extremes | st.floats(0.0, hi, exclude_min=True, allow_nan=False, allow_infinity=False)


params = st.builds(
    SamplingParams,
    temperature=st.just(0.0) | _positive(2.0),
    top_p=_positive(1.0),
    top_k=st.integers(0, 10) | st.integers(0, 2**63),
    min_p=st.just(0.0) | _positive(1.0),
    # (a seed whose low 32 bits are all ones, -1 among them, is llama.cpp's "random": not fixed)
    seed=st.integers(-(2**63), 2**63 - 1).filter(lambda s: s & 0xFFFFFFFF != 0xFFFFFFFF),
    repeat_penalty=_positive(None),
    presence_penalty=st.floats(-2.0, 2.0),
    frequency_penalty=st.floats(-2.0, 2.0),
    typical_p=_positive(1.0),
    ignore_eos=st.booleans(),
    logit_bias=st.lists(st.tuples(st.integers(0, 12) | st.integers(0, 2**31 - 1), st.floats(-100.0, 100.0) | st.sampled_from([-100.0, 100.0])), max_size=6).map(tuple),
    logprobs=st.none() | st.integers(0, 20),
)
# a position's logits: float16's range (what a model in half precision hands back), and float32's extremes
logit = st.floats(-65504.0, 65504.0, width=32) | st.sampled_from([3.4e38, -3.4e38, 0.0])
vocab_logits = st.integers(1, 12).flatmap(lambda n: st.lists(logit, min_size=n, max_size=n))
history = st.lists(st.integers(0, 15), max_size=20)


class Mask:
    """A grammar that allows a fixed set of tokens."""

    def __init__(self, allowed: list[bool]) -> None:
        self.mask = np.array(allowed, dtype=bool)

    def allowed(self) -> np.ndarray:
        return self.mask.copy()

    def accept(self, token: int) -> None:
        pass


def _run(sp: SamplingParams, rows: list[np.ndarray], hist: list[int], grammar: Mask | None = None) -> list[int]:
    sampler = LaneSampler(sp, hist, grammar=grammar, eog=[0])
    out = []
    for row in rows:
        token = sampler.sample(row)
        out.append(token)
        if sp.logprobs is not None:
            assert sampler.last_logprobs is not None
            lp, alts = sampler.last_logprobs
            assert not np.isnan(lp) and len(alts) == min(sp.logprobs, row.shape[0])
    return out


@FAST
@given(params, vocab_logits, history, st.integers(1, 3))
# repeat_penalty has no upper bound: -1 x 1e39 overflowed float32 to -inf on every token, and the draw had nothing left
@example(SamplingParams(temperature=1.0, repeat_penalty=1e39, seed=0), [-1.0, -2.0], [0, 1], 1)
# a tiny repeat_penalty sent a repeated token to +inf, which the draw then dropped
@example(SamplingParams(temperature=1.0, repeat_penalty=1e-39, seed=0), [1.0, 0.0, -5.0], [0], 1)
# 20 top_logprobs over a smaller vocabulary: argpartition's kth out of bounds
@example(SamplingParams(temperature=0.0, logprobs=20), [1.0, 2.0], [], 1)
def test_any_schema_valid_parameters_give_a_token_in_the_vocabulary_the_same_for_a_seed(sp: SamplingParams, logits: list[float], hist: list[int], steps: int) -> None:
    rows = [np.array(logits, dtype=np.float32)] * steps
    first = _run(sp, rows, hist)
    assert all(0 <= t < len(logits) for t in first)
    assert _run(sp, rows, hist) == first  # a fixed seed repeats itself


@FAST
@given(params, vocab_logits, history, st.data())
def test_a_grammar_always_has_its_way(sp: SamplingParams, logits: list[float], hist: list[int], data: st.DataObject) -> None:
    allowed = data.draw(st.lists(st.booleans(), min_size=len(logits), max_size=len(logits)).filter(any))
    (token,) = _run(sp, [np.array(logits, dtype=np.float32)], hist, Mask(allowed))
    assert allowed[token]


@FAST
@given(params.filter(lambda sp: sp.temperature > 0), vocab_logits, history, st.integers(1, 4), st.integers(1, 3))
def test_a_lane_bound_again_goes_on_with_the_same_draws(sp: SamplingParams, logits: list[float], hist: list[int], before: int, after: int) -> None:
    row = np.array(logits, dtype=np.float32)
    whole = LaneSampler(sp, hist)
    tokens = [whole.sample(row) for _ in range(before + after)]
    parked = LaneSampler(sp, hist)
    done = [parked.sample(row) for _ in range(before)]
    rebound = LaneSampler(sp, [*hist, *done], draws=parked.draws)
    assert done + [rebound.sample(row) for _ in range(after)] == tokens


@FAST
@given(params, vocab_logits)
def test_a_ban_holds_whenever_another_token_is_left(sp: SamplingParams, logits: list[float]) -> None:
    banned = {t for t, b in dict(sp.logit_bias).items() if b <= -100.0 and t < len(logits)} | ({0} if sp.ignore_eos else set())
    if len(banned) == len(logits):
        return
    sp_no_penalty = SamplingParams(**{**sp.__dict__, "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0})
    row = np.clip(np.array(logits, dtype=np.float32), -1e6, 1e6)  # a ban is -1e9: finitely below any real logit
    (token,) = _run(sp_no_penalty, [row], [])
    assert token not in banned


@FAST
@given(vocab_logits, st.integers(0, 20))
def test_logprobs_are_finite_and_at_most_the_vocabulary(logits: list[float], top: int) -> None:
    row = np.array(logits, dtype=np.float32)
    for token in range(row.shape[0]):
        lp, alts = logprobs_of(row, token, top)
        assert lp <= 1e-9 and not np.isnan(lp) and len(alts) == min(top, row.shape[0])


@FAST
@given(st.integers(-(2**63), 2**63 - 1), st.sampled_from([1e-39, 1e-300, 5e-324]))
def test_a_tiny_repeat_penalty_makes_the_repeated_token_win_at_any_temperature_as_greedy(seed: int, penalty: float) -> None:
    # a positive logit divided by it went to +inf, and the draw (finite logits only) dropped it
    row = np.array([1.0, 0.0, -5.0], dtype=np.float32)
    greedy = LaneSampler(SamplingParams(temperature=0.0, repeat_penalty=penalty), [0]).sample(row)
    drawn = LaneSampler(SamplingParams(temperature=1.0, repeat_penalty=penalty, seed=seed), [0]).sample(row)
    assert greedy == drawn == 0
