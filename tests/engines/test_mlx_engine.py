"""What only the MLX engine has: per-lane caches merged into one batch cache for decode rounds.
The engine contract (both engines) is tests/engines/test_contract.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from testkit.engine_driver import Run, drive, release

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def mlx(mlx_float_dir: Path) -> Iterator[Any]:
    from scheduler.engines.mlx import MlxEngine

    with closing(MlxEngine(mlx_float_dir, n_lanes=2, lane_ctx=1024)) as engine:
        yield engine


def test_lanes_decoding_merged_hold_their_kv_once(mlx: Any) -> None:
    """Merging the decoding lanes' caches into one batch cache copies their KV; the per-lane
    copies were kept beside it for as long as the lanes decoded together, so batched decoding
    held every lane's KV twice (a long context on many lanes ran out of memory at half the
    size)."""
    import mlx.core as mx

    prompt = mlx.tokenize("one two three four five six seven " * 100, add_special=False)[:700]
    runs = [Run(0, prompt, max_tokens=3), Run(1, prompt, max_tokens=3)]
    drive(mlx, runs, ticks=1)  # each lane prefilled in its own cache
    assert [len(r.output) for r in runs] == [1, 1]
    before = mx.get_active_memory()
    drive(mlx, runs, ticks=1)  # one decode round of both lanes, merged
    grown = mx.get_active_memory() - before
    kv = sum(mlx.save(lane).nbytes for lane in (0, 1))  # both lanes' KV, 701 tokens each
    # the batch cache holds a few spare positions beyond the lanes' own (256-token steps);
    # another copy of both lanes' KV would be more than ``kv`` again
    assert grown < kv, (grown, kv)
    release(mlx, 0, 1)


def test_a_padded_vocabulary_never_samples_an_id_the_tokenizer_lacks(mlx: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Models whose config.json pads ``vocab_size`` past the tokenizer (for kernels' sake) give
    logits that wide; the padding's logits are untrained. The sampler picked from the whole row,
    so a padded column with the largest logit became a token id no tokenizer knows (greedy
    returned it; detokenising it failed). Sampling is limited to the tokenizer's ids."""
    import numpy as np

    prompt = mlx.tokenize("one two three", add_special=False)
    real = mlx._step

    def padded(pieces: Any) -> dict[int, np.ndarray]:
        rows = real(pieces)
        wide = {}
        for lane, row in rows.items():
            pad = np.full(64, float(row.max()) + 10.0, dtype=row.dtype)  # the padding wins greedy
            wide[lane] = np.concatenate([row, pad])
        return wide

    monkeypatch.setattr(mlx, "_step", padded)
    run = Run(0, prompt, max_tokens=2)
    drive(mlx, [run])
    release(mlx, 0)
    assert run.output and all(0 <= t < mlx.vocab_size for t in run.output), (run.output, mlx.vocab_size)


def test_an_mlx_failure_in_a_step_is_an_engine_error_with_the_ticks_partial_result(mlx: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLX reports a failed computation (Metal's "[metal::malloc] Attempting to allocate ...
    greater than the maximum allowed buffer size" for a long prompt chunk, an allocation that
    fails) as a RuntimeError. It left execute() as that, not as the protocol's EngineError, so
    the worker's loop, which catches EngineError, ended: every job of the worker lost and the
    worker gone, where llama.cpp's failed decode fails the running jobs and the worker goes on.
    Now it is an EngineError carrying what the tick ran before the step, and once the lanes are
    emptied the engine replies as before."""
    from scheduler.core.types import LaneBind, LaneFeed, TickPlan
    from scheduler.engines.base import EngineError
    from testkit.engine_driver import GREEDY, chat, generate, never

    prompt = chat(mlx, "What is the capital of France?")
    want = generate(mlx, 0, prompt, max_tokens=3)
    release(mlx, 0)
    model = mlx._model

    calls = []

    def failing(inputs: Any, cache: Any = None) -> Any:
        calls.append(inputs.shape)
        if len(calls) == 3:  # the second step's prompt chunk
            raise RuntimeError("[metal::malloc] Attempting to allocate 12884901888 bytes which is greater than the maximum allowed buffer size")
        return model(inputs, cache=cache)

    monkeypatch.setattr(mlx, "_model", failing)
    plan = TickPlan(tick=1, step_tokens=4, bind=[LaneBind(0, "a", GREEDY), LaneBind(1, "b", GREEDY)])
    plan.feeds = [LaneFeed(0, "a", 0, prompt[:1], False), LaneFeed(1, "b", 0, prompt, True)]
    with pytest.raises(EngineError) as failed:
        mlx.execute(plan, never)
    assert failed.value.permanent and failed.value.partial is not None
    assert failed.value.partial.fed == {0: 1, 1: 3}  # the first step's, in the KV cache
    assert "allocate" in str(failed.value)
    monkeypatch.setattr(mlx, "_model", model)
    release(mlx, 0, 1)
    assert generate(mlx, 1, prompt, max_tokens=3) == want
    release(mlx, 1)
