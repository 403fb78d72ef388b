"""A channel layer slow to take the dashboard's pushes (Redis hung or far away): the feed keeps
one push on its way at a time, and the latest state is what arrives last."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dashboard.feed import SnapshotFeed


class SlowLayer:
    """A shared layer (not the in-memory one: always pushed to) whose sends wait until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.delivered: list[int] = []

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.release.wait()
            self.delivered.append(message["state"]["tick"])
        finally:
            self.in_flight -= 1


async def test_pushes_wait_for_a_slow_layer_one_at_a_time_and_the_latest_arrives_last(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = SlowLayer()
    monkeypatch.setattr("channels.layers.get_channel_layer", lambda *a, **k: layer)
    feed = SnapshotFeed(min_interval_s=0.005)
    for tick in range(40):  # snapshots keep coming (ten a second) while the layer hangs
        feed.on_snapshot({"model": "m", "tick": tick, "lanes": []})
        await asyncio.sleep(0.01)
    assert layer.most_in_flight == 1 and len(feed._tasks) <= 1
    layer.release.set()
    for _ in range(200):
        await asyncio.sleep(0.01)
        if layer.delivered and layer.delivered[-1] == 39 and not feed._tasks and feed._handle is None:
            break
    assert layer.delivered[0] == 0 and layer.delivered[-1] == 39 and len(layer.delivered) == 2
