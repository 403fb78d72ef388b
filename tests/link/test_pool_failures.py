"""The several-models router's pool (scheduler/link/pool.py) when a model's worker cannot even be
started: the requests for it fail with the reason, and the model can be loaded again later."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from scheduler.link.pool import ModelPool, ModelUnavailable, PoolSetup
from scheduler.models_config import ModelsConfig, ServedModel


class Unstartable:
    """A worker supervisor whose process cannot be started (what Popen raises with no file
    descriptors left)."""

    def __init__(self) -> None:
        self.exited = threading.Event()
        self.fatal: str | None = None
        self.on_fatal: Any = None
        self.restarts = 0
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        raise OSError(24, "Too many open files")

    def drain(self) -> None:
        self.exited.set()

    def kill(self) -> None:
        self.exited.set()


async def test_a_model_whose_worker_cannot_be_started_fails_its_requests_and_can_be_tried_again() -> None:
    """It used to stay "loading" for good: its requests waited forever, and so did every request
    behind them once the router had no room for another model."""
    workers: list[Unstartable] = []

    def spawn(_model: str, _sockets: Any) -> Unstartable:
        workers.append(Unstartable())
        return workers[-1]

    cfg = ModelsConfig((ServedModel("a", Path("/m/a.gguf")),))
    pool = ModelPool(PoolSetup(cfg, spawn=spawn, lanes={"a": 2}, ctx_sizes={"a": 512}))  # type: ignore[arg-type]
    for attempt in (1, 2):  # a second request tries the load again
        with pytest.raises(ModelUnavailable) as err:
            await asyncio.wait_for(pool.acquire("a", 0), 10)
        assert "could not be started" in err.value.detail and "Too many open files" in err.value.detail
        assert len(workers) == attempt and not pool.router.state("a").resident
    assert "a" not in pool.links and "a" not in pool.workers and "a" not in pool.open_links
