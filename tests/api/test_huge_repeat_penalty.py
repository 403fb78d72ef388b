"""A ``repeat_penalty`` beyond float32's range (the schema bounds it only below: any finite
number above 0): llama.cpp's penalties sampler takes it as a C float, +inf, and a repeated
token's logit of exactly 0 times +inf is NaN, which its greedy sampler then picks (NaN never
compares greater) and its softmax spreads to every token. Both engines apply
``repeat_penalty_of``, so it is held to float32's largest value there: any penalty that large
already sends every other repeated logit to 0 or float32's bottom, as before."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from api.schemas import parse_chat_request
from scheduler.core.types import SamplingParams
from scheduler.engines.sampling import LaneSampler, repeat_penalty_of
from tests.engines.test_sampling_bans_penalties import _chain_pick

# token 0 was generated and its logit is exactly 0: a penalty keeps it at 0, below token 1
LOGITS = np.array([0.0, 2.0, 1.0, -1.0], dtype=np.float32)


@pytest.mark.parametrize("penalty", [1e39, 1e300, 1.7e308])
def test_the_schema_takes_a_repeat_penalty_float32_cannot_hold(penalty: float) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "repeat_penalty": penalty}
    assert parse_chat_request(json.dumps(body).encode(), models=["m"]).repeat_penalty == penalty


@pytest.mark.parametrize("penalty", [1e39, 1e300, 1.7e308])
def test_greedy_passes_over_a_repeated_zero_logit_under_a_huge_repeat_penalty_on_both_engines(penalty: float) -> None:
    sp = SamplingParams(temperature=0.0, repeat_penalty=penalty)
    # token 1 on both; llama.cpp picked token 0, whose logit had become NaN
    assert (LaneSampler(sp, [0, 3]).sample(LOGITS), _chain_pick(sp, [0, 3], LOGITS)) == (1, 1)
    assert repeat_penalty_of(sp) == float(np.finfo(np.float32).max)


def test_the_llama_cpp_chain_draws_no_nan_under_a_huge_repeat_penalty() -> None:
    # at temperature 1 a NaN logit made every probability NaN: the draw fell on the last
    # candidate whatever the logits; now the best token (1) comes up most often
    sp = [SamplingParams(temperature=1.0, seed=seed, repeat_penalty=1e39) for seed in range(60)]
    picks = [_chain_pick(s, [0, 3], LOGITS) for s in sp]
    assert picks.count(1) > picks.count(3) and picks.count(1) > 20, picks


def test_an_ordinary_repeat_penalty_is_as_it_was() -> None:
    assert repeat_penalty_of(SamplingParams(repeat_penalty=1.3)) == 1.3
    assert repeat_penalty_of(SamplingParams(repeat_penalty=3e38)) == 3e38


@pytest.mark.parametrize("name", ["repeat_penalty", "repetition_penalty"])
def test_a_repeat_penalty_integer_beyond_any_float_is_the_largest_float_not_a_500(name: str) -> None:
    # 10**400 is a JSON integer (the parser keeps it exact); float() of it raised OverflowError,
    # which the consumer answered with a 500
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "' + name.encode() + b'": 1' + b"0" * 400 + b"}"
    assert parse_chat_request(raw, models=["m"]).repeat_penalty == sys.float_info.max
