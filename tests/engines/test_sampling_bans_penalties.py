"""A ban (logit_bias -100, ignore_eos) holds whatever the penalties, on the NumPy
sampler (MLX) and on the llama.cpp sampler chain as the llama.cpp engine builds it."""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp
import numpy as np
import pytest

from scheduler.core.types import SamplingParams
from scheduler.engines.llama_cpp import _TOKEN_DATA, LlamaCppEngine
from scheduler.engines.sampling import LaneSampler

BANNED = 2
# token 2 has the best raw logit, is banned, and was generated already (a grammar that allowed
# only it forced it): a tiny repeat penalty multiplies its banned (negative) logit towards 0 and
# a negative presence penalty then lifts it over the others
LOGITS = np.array([1.0, 0.5, 5.0, -3.0], dtype=np.float32)
CASES = [
    {"repeat_penalty": 1e-12, "presence_penalty": -2.0},
    {"repeat_penalty": 1e-12, "frequency_penalty": -2.0},
    {"repeat_penalty": 1e-9},
]


def _params(temperature: float, ignore_eos: bool, seed: int, **pen: float) -> SamplingParams:
    bias = () if ignore_eos else ((BANNED, -100.0),)
    return SamplingParams(temperature=temperature, seed=seed, logit_bias=bias, ignore_eos=ignore_eos, **pen)


def _logits(pen: dict[str, float]) -> np.ndarray:
    # with the repeat penalty alone the banned token must beat only negative logits
    return LOGITS if len(pen) > 1 else np.array([-1.5, -2.0, 5.0, -3.0], dtype=np.float32)


@pytest.mark.parametrize("ignore_eos", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("pen", CASES)
def test_numpy_a_ban_holds_on_a_token_in_the_penalty_window(pen: dict[str, float], temperature: float, ignore_eos: bool) -> None:
    for seed in range(20):
        s = LaneSampler(_params(temperature, ignore_eos, seed, **pen), [BANNED], eog=[BANNED])
        assert s.sample(_logits(pen)) != BANNED


def _chain_pick(sp: SamplingParams, history: list[int], logits: np.ndarray) -> int:
    eng: Any = LlamaCppEngine.__new__(LlamaCppEngine)
    eng.vocab_size = logits.shape[0]
    eng._eog_ids = [BANNED]
    chain, grammar = eng._build_sampler(sp)
    assert grammar is None
    try:
        for t in history:
            llama_cpp.llama_sampler_accept(chain, t)
        data = np.zeros(logits.shape[0], dtype=_TOKEN_DATA)
        data["id"] = np.arange(logits.shape[0])
        data["logit"] = logits
        arr = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
            size=logits.shape[0],
            selected=-1,
            sorted=False,
        )
        llama_cpp.llama_sampler_apply(chain, ctypes.byref(arr))
        return int(data["id"][arr.selected])
    finally:
        llama_cpp.llama_sampler_free(chain)


@pytest.mark.parametrize("ignore_eos", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("pen", CASES)
def test_llama_cpp_chain_a_ban_holds_on_a_token_in_the_penalty_window(pen: dict[str, float], temperature: float, ignore_eos: bool) -> None:
    for seed in range(20):
        assert _chain_pick(_params(temperature, ignore_eos, seed, **pen), [BANNED], _logits(pen)) != BANNED


def test_llama_cpp_chain_without_penalties_keeps_the_best_token() -> None:
    # the harness itself: greedy on the raw logits picks the best
    assert _chain_pick(SamplingParams(temperature=0.0), [], LOGITS) == BANNED


@pytest.mark.parametrize(
    ("repeat_penalty", "temperature"),
    [(1e-40, 1.0), (1e-45, 0.7), (1e-30, 1e-8), (1e-36, 1e-25), (1e-45, 0.0)],
)
def test_llama_cpp_chain_a_tiny_repeat_penalty_makes_the_repeated_token_win_not_garbage(repeat_penalty: float, temperature: float) -> None:
    # token 1 was generated and has a positive logit: a repeat penalty below 1 divides it and a
    # tiny one makes it win, as on the NumPy sampler; dividing past float32's range made it +inf
    # and llama.cpp's softmax NaN, which drew the last candidate (token 3, the least likely)
    for seed in range(10):
        sp = SamplingParams(temperature=temperature, seed=seed, repeat_penalty=repeat_penalty)
        assert LaneSampler(sp, [1]).sample(LOGITS) == 1
        assert _chain_pick(sp, [1], LOGITS) == 1


def test_greedy_picks_the_same_token_on_both_engines_whatever_the_biases_and_penalties() -> None:
    # a temperature-0 request means the same on MLX (NumPy) and llama.cpp: random logits,
    # windows, biases (bans among them), ignore_eos and penalties down to a tiny repeat penalty
    rng = np.random.default_rng(33)
    for _ in range(1500):
        v = int(rng.integers(3, 12))
        logits = rng.normal(0, 3, v).astype(np.float32)
        hist = [int(t) for t in rng.integers(0, v, int(rng.integers(0, 80)))]
        bias = tuple((int(t), float(rng.choice([-100, -5, 0.5, 3, 100]))) for t in rng.integers(0, v, int(rng.integers(0, 3))))
        sp = SamplingParams(
            temperature=0.0,
            repeat_penalty=float(rng.choice([1.0, 0.5, 1.3, 1e-12, 1e-40, 5.0, 1e30])),
            frequency_penalty=float(rng.uniform(-2, 2)),
            presence_penalty=float(rng.uniform(-2, 2)),
            logit_bias=bias,
            ignore_eos=bool(rng.integers(0, 2)),
        )
        assert LaneSampler(sp, hist, eog=[BANNED]).sample(logits) == _chain_pick(sp, hist, logits), (sp, hist, logits)
