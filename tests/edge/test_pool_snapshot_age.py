"""Several models: the pool's link tells how old the snapshot it shows is, and whether the
worker it came from is still there (docs: the dashboard shows an away worker's lanes as old)."""

from __future__ import annotations

import time
import types

from dashboard.consumers import snapshot_age_ms
from scheduler.link.pool import PoolLink


class _AwayWorkerLink:
    """The last used model's link while its worker is away (crashed, restarting)."""

    connected = False
    snapshot = {"lanes": [{"state": "decode"}]}
    hello = None

    def __init__(self) -> None:
        self.snapshot_at = time.monotonic() - 30


def test_the_pool_link_gives_its_snapshots_time_and_its_workers_connection() -> None:
    """PoolLink.snapshot_at was never set (None) and the pool link is always connected: a
    dashboard opened while the last used model's worker was away showed that worker's
    30-second-old lanes as live."""
    away = _AwayWorkerLink()
    link = PoolLink(types.SimpleNamespace(last_model="smol", links={"smol": away}))  # type: ignore[arg-type]
    assert link.snapshot == away.snapshot
    assert link.snapshot_at == away.snapshot_at
    assert link.snapshot_connected is False
    assert 29_000 <= snapshot_age_ms(link) <= 60_000  # what a page opened now is told
    away.connected = True  # the worker is back: its pushes are live
    assert snapshot_age_ms(link) is None
    empty = PoolLink(types.SimpleNamespace(last_model=None, links={}))  # type: ignore[arg-type]
    assert empty.snapshot_at is None and empty.snapshot_connected is True
