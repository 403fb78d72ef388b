"""The NumPy sampler chain (the MLX engine's) against llama.cpp's seed rules."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core.types import SamplingParams
from scheduler.engines.sampling import LaneSampler

FLAT = np.zeros(1000, dtype=np.float32)  # every token alike: a draw is the random stream's alone


@pytest.mark.parametrize("seed", [-1, 2**32 - 1])
def test_seed_minus_one_is_a_fresh_random_stream_as_on_llama_cpp(seed: int) -> None:
    """llama-server's ``seed: -1`` means a random seed, and the llama.cpp engine's chain treats
    it so (``seed & 0xFFFFFFFF`` is LLAMA_DEFAULT_SEED); the NumPy chain seeded a fixed stream
    with it, so on MLX every "regenerate" sent with seed -1 gave the same reply."""
    sp = SamplingParams(temperature=1.0, seed=seed)
    replies = {tuple(LaneSampler(sp).sample(FLAT) for _ in range(6)) for _ in range(4)}
    assert len(replies) > 1


def test_seed_minus_one_skips_no_draws_when_bound_again() -> None:
    """A random stream has nothing to resume: binding again with history must not fail or
    pretend to skip (no seed to repeat)."""
    sp = SamplingParams(temperature=1.0, seed=-1)
    sampler = LaneSampler(sp, history=[1, 2, 3], draws=3)
    assert 0 <= sampler.sample(FLAT) < FLAT.shape[0]


def test_other_seeds_still_repeat() -> None:
    for seed in (0, 7, -2, 2**63 - 2):
        sp = SamplingParams(temperature=1.0, seed=seed)
        runs = {tuple(s.sample(FLAT) for _ in range(6)) for s in (LaneSampler(sp), LaneSampler(sp))}
        assert len(runs) == 1
