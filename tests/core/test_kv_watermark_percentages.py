"""The watermarks are whole percentages of the pool's blocks: 70% of 90 blocks is 63 blocks,
not the 62.99… that ``0.7 * 90`` gives in floating point, so an eviction round stops at exactly
the low watermark (docs/scheduling.md, "Watermarks (MLX)": evicted down to ``--pressure-low``)."""

from __future__ import annotations

import pytest

from scheduler.core.kv_pool import KvPool, PoolConfig, PoolOps


def _pool_at(low: int, high: int, sizes: list[int], lane_tokens: int, *, lane_ctx: int = 240) -> tuple[KvPool, int]:
    """A pool of one lane and one cache slot per size (``lane_ctx`` tokens each); the prefixes
    are stored least recently used first, in the order given."""
    pool = KvPool(PoolConfig(n_lanes=1, lane_ctx=lane_ctx, cache_slots=len(sizes), pressure_high=high / 100, pressure_low=low / 100))
    for k, size in enumerate(sizes):
        assert pool.store(PoolOps(), 0, [k + 3] * size, float(k)) is not None
    pool.settle({})
    return pool, lane_tokens


def test_an_eviction_round_stops_at_exactly_the_low_watermark() -> None:
    """90 blocks, --pressure-low 70: 78 blocks used (>= 85%) evict down to 63 (70% exactly),
    which is one prefix; a second would take the pool to 48 blocks (53%)."""
    pool, lane = _pool_at(70, 85, [240, 240, 240, 48, 240], 240)  # 15 + 15 + 15 + 3 + 15 blocks, lane 15
    assert pool.total_blocks == 90
    assert pool.used_blocks([lane]) == 78
    assert pool.enforce_watermarks(PoolOps(), [lane], 10.0) == 1
    assert pool.used_blocks([lane]) == 63


@pytest.mark.parametrize(
    ("low", "high", "n_lanes", "ctx_blocks", "lanes", "sizes"),
    [
        (70, 85, 1, 15, [15], [15, 15, 15, 3, 15]),  # 90 blocks: 70% is 63, float 62.99…
        (29, 40, 3, 20, [20, 5, 0], [20, 4]),  # 100 blocks: 29% is 29, float 28.99…
        (35, 50, 1, 30, [30], [30, 30, 3, 0, 0]),  # 180 blocks: 35% is 63, float 62.99…
    ],
)
def test_a_round_stops_at_a_low_watermark_that_floats_round_down(
    low: int, high: int, n_lanes: int, ctx_blocks: int, lanes: list[int], sizes: list[int]
) -> None:
    """The least recently used prefix takes the pool to exactly --pressure-low: one eviction."""
    pool = KvPool(
        PoolConfig(n_lanes=n_lanes, lane_ctx=16 * ctx_blocks, cache_slots=len(sizes), pressure_high=high / 100, pressure_low=low / 100)
    )
    for k, size in enumerate(b for b in sizes if b):
        assert pool.store(PoolOps(), 0, [k + 3] * (16 * size), float(k)) is not None
    pool.settle({})
    lane_tokens = [16 * b for b in lanes]
    total = pool.total_blocks
    assert pool.used_blocks(lane_tokens) * 100 >= high * total
    assert (pool.used_blocks(lane_tokens) - 16 * sizes[0] // 16) * 100 == low * total
    assert pool.enforce_watermarks(PoolOps(), lane_tokens, 10.0) == 1
    assert pool.used_blocks(lane_tokens) * 100 == low * total


def test_the_high_watermark_acts_at_exactly_a_percentage_that_floats_round_up() -> None:
    """25 blocks, --pressure-high 56: 14 blocks used is 56% (``0.56 * 25`` is 14.000…02) and
    evicts; 13 does not."""
    pool = KvPool(PoolConfig(n_lanes=4, lane_ctx=80, cache_slots=1, pressure_high=0.56, pressure_low=0.5))
    assert pool.store(PoolOps(), 0, [3] * 32, 1.0) is not None  # 2 blocks
    pool.settle({})
    assert pool.total_blocks == 25
    assert pool.enforce_watermarks(PoolOps(), [80, 80, 16, 0], 10.0) == 0  # 5 + 5 + 1 + 2: 13 blocks
    assert pool.enforce_watermarks(PoolOps(), [80, 80, 32, 0], 10.0) == 1  # 5 + 5 + 2 + 2: 14 blocks
