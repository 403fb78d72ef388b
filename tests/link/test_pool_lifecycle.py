"""The several-models pool (scheduler/link/pool.py): what happens to a model's worker process
when it is unloaded while serve exits, and when its supervisor fails half-way through starting;
how /metrics and the live dashboard show a model loaded, used and unloaded again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from scheduler.link.pool import ModelPool, ModelUnavailable, PoolSetup
from scheduler.models_config import ModelsConfig, ServedModel

from .test_pool_failures import Startable, two_models


class Proc(Startable):
    """A model's worker supervisor with a process that exits only when killed (a worker slow to
    drain), or whose ``start`` launches the process and then fails (``error``): what
    ``WorkerSupervisor.start`` does when its watching thread cannot be started."""

    running = False

    def start(self) -> None:
        self.running = True  # the process runs
        if self.error is not None:
            raise self.error

    def drain(self) -> None:
        self.drained = True  # SIGTERM: it takes its time

    def kill(self) -> None:
        self.running = False
        self.exited.set()


async def until(condition: Any, what: str) -> None:
    """Let the loop run until ``condition()`` holds; the deadline only bounds a hang."""
    deadline = asyncio.get_running_loop().time() + 10
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.001)


async def test_a_worker_being_unloaded_is_waited_for_and_killed_when_serve_exits() -> None:
    """A swap unloading model a (its worker slow to exit) when serve stopped: the pool said every
    worker had exited, since a's was no longer among its workers, and serve's final kill passed it
    by, leaving a process that holds the model's memory after serve said it stopped."""
    pool, spawned = two_models(worker=Proc)
    waiting = asyncio.ensure_future(pool.acquire("a", 0))
    await until(lambda: "a" in pool.links, "a's load started")
    pool.links["a"]._connected.set()  # its worker says hello
    _link, _d, ticket = await asyncio.wait_for(waiting, 10)
    pool.release(ticket)
    for_b = asyncio.ensure_future(pool.acquire("b", 0))  # one slot: a is unloaded for it
    worker_a = spawned["a"][0]
    await until(lambda: worker_a.drained, "a's worker told to stop")
    assert "a" not in pool.workers and not worker_a.exited.is_set()
    assert not pool.exited()  # its worker still runs
    pool.kill()
    assert not worker_a.running and worker_a.exited.is_set()
    await until(lambda: pool.router.state("a").value == "unloaded", "a unloaded")
    for_b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await for_b
    pool.kill()
    assert pool.exited()


async def test_a_worker_whose_supervisor_fails_after_starting_its_process_is_killed() -> None:
    """``WorkerSupervisor.start`` starts the process, then its watching thread: a thread that
    could not be started failed the load, but the process it had started ran on, unknown to the
    pool (never drained or killed, even when serve exited), while the next request for the model
    started a second worker for it beside the first."""
    pool, spawned = two_models({"b": RuntimeError("can't start new thread")}, worker=Proc)
    with pytest.raises(ModelUnavailable, match="can't start new thread"):
        await asyncio.wait_for(pool.acquire("b", 0), 10)
    assert not spawned["b"][0].running and spawned["b"][0].exited.is_set()
    assert pool.exited()


async def used_once(pool: ModelPool, model: str) -> None:
    """A request for ``model`` loads it (its worker says hello), runs and ends."""
    waiting = asyncio.ensure_future(pool.acquire(model, 0))
    await until(lambda: model in pool.links, f"{model}'s load started")
    pool.links[model]._connected.set()  # its worker says hello
    _link, _d, ticket = await asyncio.wait_for(waiting, 10)
    pool.release(ticket)


async def test_the_load_time_histogram_has_a_single_inf_bucket() -> None:
    """The load-time buckets ended with +inf and /metrics adds the +Inf bucket (the count)
    itself: every model's superfluid_model_load_seconds had two ``le="+Inf"`` samples, an
    exposition Prometheus reports as duplicate samples and OpenMetrics parsers refuse."""
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    from api.metrics import router_families

    pool, _spawned = two_models()
    await used_once(pool, "a")
    stats = pool.router_stats()
    assert all(le != float("inf") for h in stats["load_seconds"].values() for le in h["le"])  # HistogramStats: finite bounds

    class Router:
        def collect(self) -> Any:
            return router_families(stats)

    registry = CollectorRegistry()
    registry.register(Router())  # type: ignore[arg-type]
    samples = [line.rsplit(" ", 1)[0] for line in generate_latest(registry).decode().splitlines() if line and not line.startswith("#")]
    assert 'superfluid_model_load_seconds_bucket{le="+Inf",model="a"}' in samples
    assert len(samples) == len(set(samples)), sorted({s for s in samples if samples.count(s) > 1})
    pool.kill()


@pytest.mark.parametrize("how", ["admin unload", "ttl"])
async def test_the_live_dashboard_is_told_when_the_last_loaded_model_is_unloaded(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """The dashboard is pushed when a worker's snapshot arrives, and by the router's tick only
    while requests wait for a load. Once the only loaded model was unloaded (its TTL, the admin's
    Unload) with nothing waiting, nothing was pushed any more: an open page went on showing it
    loaded, its lanes idle, then "no update for N s" as if its worker had hung."""
    from dashboard.feed import full_state
    from scheduler.link import pool as pool_module

    clock = [0.0]  # the router's clock: the TTL passes when the test says so
    cfg = ModelsConfig((ServedModel("a", Path("/m/a.gguf"), ttl_s=5.0), ServedModel("b", Path("/m/b.gguf"))))
    setup = PoolSetup(cfg, spawn=lambda _m, _s: Startable(), lanes={"a": 2, "b": 1}, ctx_sizes={"a": 512, "b": 512})  # type: ignore[arg-type,return-value]
    pool = ModelPool(setup, clock=lambda: clock[0])
    pushed: list[dict[str, Any]] = []
    monkeypatch.setattr(pool_module, "SNAPSHOT_LISTENERS", [pushed.append])
    monkeypatch.setitem(pool_module._POOLS, id(asyncio.get_running_loop()), pool)
    pool.start()
    try:
        await used_once(pool, "a")
        assert [m["id"] for m in full_state(pool.link.snapshot or {})["models"]] == ["a"]  # what its worker's pushes show
        shown = len(pushed)
        if how == "ttl":
            clock[0] += 10.0  # the router's tick unloads it
        else:
            pool.unload("a")
        await until(lambda: not pool.router.state("a").resident and "a" not in pool.links, "a unloaded")
        await until(lambda: len(pushed) > shown, "the page told")  # by the router's tick, every TICK_S
        assert full_state(pushed[-1])["models"] == []  # the page: no model loaded
    finally:
        pool.kill()
        if pool._ticker is not None:
            pool._ticker.cancel()
