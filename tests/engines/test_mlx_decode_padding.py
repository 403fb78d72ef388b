"""Batched decode on MLX merges the decoding lanes' caches into left-padded batch caches: every
lane in one batch holds as many positions as the longest of them. The KV pool counts tokens, so
the memory held must stay near the lanes' own lengths."""

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

    with closing(MlxEngine(mlx_float_dir, n_lanes=4, lane_ctx=1024)) as engine:
        yield engine


def test_a_long_lane_decoding_beside_short_ones_does_not_pad_them_to_its_length(
    mlx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One 700-token lane decoding beside three 20-token ones: the four were merged into one
    batch cache left-padded to 700 positions each, ~4x the tokens the lanes hold (and the pool
    accounts), so MLX could run out of memory below the pool's watermarks. Lanes of far
    different lengths decode in separate batches of the same step, and the replies stay those
    of each lane decoding alone."""
    from mlx_lm.models.cache import BatchKVCache

    merges: list[list[int]] = []
    real = BatchKVCache.merge.__func__

    def recording(cls: Any, caches: list[Any]) -> Any:
        merges.append([c.size() for c in caches])
        return real(cls, caches)

    text = "one two three four five six seven " * 100
    long = mlx.tokenize(text, add_special=False)[:700]
    shorts = [mlx.tokenize(f"{w} apples and pears", add_special=False) for w in ("red", "green", "ripe")]
    alone = []
    for prompt in [long, *shorts]:
        alone.append(drive(mlx, [Run(0, prompt, max_tokens=4)])[0].output)
        release(mlx, 0)

    monkeypatch.setattr(BatchKVCache, "merge", classmethod(recording))
    runs = [Run(0, long, max_tokens=4)] + [Run(i + 1, p, max_tokens=4) for i, p in enumerate(shorts)]
    drive(mlx, runs, step_tokens=1024)
    release(mlx, 0, 1, 2, 3)

    assert [r.output for r in runs] == alone
    assert merges, "the lanes never decoded batched"
    for lengths in merges:
        held, own = len(lengths) * max(lengths), sum(lengths)
        assert held <= 1.5 * own + 256 * len(lengths), lengths  # bounded padding (plus one cache step)
    assert any(len(m) == 3 for m in merges), merges  # the short lanes still decode together
