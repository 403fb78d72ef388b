"""The several-models router's pool (scheduler/link/pool.py) when a model's worker cannot even be
started: the requests for it fail with the reason, and the model can be loaded again later."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scheduler.engines.sim import FakeClock
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
    clock = FakeClock()
    pool = ModelPool(PoolSetup(cfg, spawn=spawn, lanes={"a": 2}, ctx_sizes={"a": 512}), clock=clock)  # type: ignore[arg-type]
    for attempt in (1, 2):  # a second request, after the failed load's backoff, tries the load again
        clock.advance(pool.router.backoff_left("a"))
        with pytest.raises(ModelUnavailable) as err:
            await asyncio.wait_for(pool.acquire("a", 0), 10)
        assert "could not be started" in err.value.detail and "Too many open files" in err.value.detail
        assert len(workers) == attempt and not pool.router.state("a").resident
    assert "a" not in pool.links and "a" not in pool.workers and "a" not in pool.open_links


class Startable:
    """A worker supervisor that starts (its link is made to look connected by the test), or
    fails to with ``error``."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.exited = threading.Event()
        self.fatal: str | None = None
        self.on_fatal: Any = None
        self.restarts = 0
        self.error = error
        self.drained = False

    def start(self) -> None:
        if self.error is not None:
            raise self.error

    def drain(self) -> None:
        self.drained = True
        self.exited.set()

    def kill(self) -> None:
        self.exited.set()


def two_models(
    errors: dict[str, BaseException] | None = None, worker: Callable[[BaseException | None], Any] = Startable, clock: Callable[[], float] | None = None
) -> tuple[ModelPool, dict[str, list[Any]]]:
    """A pool of models ``a`` and ``b``, one lane each, whose workers ``worker`` stands in for
    (``errors``: what each model's worker's start raises); the workers it spawned, by model.
    ``clock``: the router's (a failed load's backoff runs on it)."""
    spawned: dict[str, list[Any]] = {"a": [], "b": []}

    def spawn(model: str, _sockets: Any) -> Any:
        spawned[model].append(worker((errors or {}).get(model)))
        return spawned[model][-1]

    cfg = ModelsConfig((ServedModel("a", Path("/m/a.gguf")), ServedModel("b", Path("/m/b.gguf"))))
    setup = PoolSetup(cfg, spawn=spawn, lanes={"a": 1, "b": 1}, ctx_sizes={"a": 512, "b": 512})  # type: ignore[arg-type]
    return (ModelPool(setup, clock) if clock is not None else ModelPool(setup)), spawned


async def loaded(pool: ModelPool, model: str) -> None:
    """The model's worker says hello (its link connects)."""
    pool.links[model]._connected.set()
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_worker_that_fails_to_start_with_any_error_fails_its_requests_and_leaves_the_other_model_usable() -> None:
    """Only OSError was caught: a RuntimeError (no thread could be started) left the model
    "loading" for good, holding the only slot, and every request for any model waited forever."""
    pool, _spawned = two_models({"b": RuntimeError("can't start new thread")})
    with pytest.raises(ModelUnavailable, match="can't start new thread"):
        await asyncio.wait_for(pool.acquire("b", 0), 10)
    waiting = asyncio.ensure_future(pool.acquire("a", 0))
    for _ in range(20):
        await asyncio.sleep(0)
    await loaded(pool, "a")
    link, _dispatch, ticket = await asyncio.wait_for(waiting, 10)
    assert link is pool.links["a"]
    pool.release(ticket)
    pool.kill()


async def test_after_a_drain_no_worker_is_started_for_an_admin_load() -> None:
    """SIGTERM with an admin Load pending (the busy model reserved for it): once the busy
    model's request ended, the other model's worker was started mid-shutdown, never drained, and
    serve waited its whole --drain-timeout. A Load asked after the drain did the same."""
    pool, spawned = two_models()
    waiting = asyncio.ensure_future(pool.acquire("a", 0))
    for _ in range(20):
        await asyncio.sleep(0)
    await loaded(pool, "a")
    _link, _dispatch, ticket = await asyncio.wait_for(waiting, 10)
    pool.load("b")
    pool.drain()
    pool.release(ticket)
    pool.load("b")
    for _ in range(20):
        await asyncio.sleep(0)
    assert spawned["b"] == [] and pool.exited()


async def test_a_failed_load_leaves_no_task_waiting_for_its_worker() -> None:
    """Each load waits for its worker's hello; a load that failed left that wait pending for
    ever, one task (and its link) per failure."""
    clock = FakeClock()
    pool, spawned = two_models(clock=clock)
    for attempt in range(3):
        clock.advance(pool.router.backoff_left("a"))  # each load is a request's, once the last failure's backoff has passed
        waiting = asyncio.ensure_future(pool.acquire("a", 0))
        for _ in range(20):
            await asyncio.sleep(0)
        worker = spawned["a"][-1]
        worker.fatal = "its worker exited"
        pool._load_failed("a", worker)
        with pytest.raises(ModelUnavailable):
            await asyncio.wait_for(waiting, 10)
        for _ in range(20):
            await asyncio.sleep(0)
        pending = [t for t in asyncio.all_tasks() if "_await_loaded" in repr(t)]
        assert pending == [], (attempt, pending)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def running(pool: ModelPool, model: str) -> str:
    """The first request for ``model`` (its worker loaded for it), dispatched: its ticket."""
    first = asyncio.ensure_future(pool.acquire(model, 0))
    await settle()
    await loaded(pool, model)
    _link, _d, ticket = await asyncio.wait_for(first, 10)
    return ticket


async def test_a_drain_serves_the_requests_waiting_for_a_lane_of_a_loaded_model_before_its_worker_drains() -> None:
    """SIGTERM with a request waiting at the router for the only lane of a loaded model: it was
    answered 503 "shutting down" at once, and the worker was drained under the running one,
    although the same request waiting at a single model's worker runs to completion. Now it runs:
    the worker is told to drain once nothing of its model waits or runs (never while a request
    is on its way to it). A request for a model that is not loaded still ends at once."""
    pool, spawned = two_models()
    first_ticket = await running(pool, "a")
    second = asyncio.ensure_future(pool.acquire("a", 0))
    for_b = asyncio.ensure_future(pool.acquire("b", 0))  # b cannot load: a's slot is busy
    await settle()
    worker_a = spawned["a"][0]
    pool.drain()
    await settle()
    with pytest.raises(ModelUnavailable, match="shutting down"):
        await asyncio.wait_for(for_b, 10)
    assert not second.done() and not worker_a.drained
    with pytest.raises(ModelUnavailable, match="shutting down"):
        await pool.acquire("a", 0)  # nothing new
    pool.release(first_ticket)
    link, _d, second_ticket = await asyncio.wait_for(second, 10)
    assert link is pool.links["a"] and not worker_a.drained  # its submit is on its way
    pool.release(second_ticket)
    assert worker_a.drained and pool.exited() and spawned["b"] == []


async def test_at_the_drain_deadline_every_request_still_waiting_at_the_router_ends() -> None:
    pool, spawned = two_models()
    ticket = await running(pool, "a")
    second = asyncio.ensure_future(pool.acquire("a", 0))
    await settle()
    pool.drain()
    pool.fail_waiting("The server shut down before this request finished.")
    with pytest.raises(ModelUnavailable, match="shut down before"):
        await asyncio.wait_for(second, 10)
    pool.release(ticket)
    assert spawned["a"][0].drained and pool.exited()


async def test_serves_drain_leaves_the_request_waiting_for_a_lane_free_to_be_submitted() -> None:
    """serve's SIGTERM (its ``Drain``) marked every link draining, the pool's per-model links
    too, before the pool drained: the request waiting at the router for the lane of a loaded
    model was dispatched as the lane freed, as documented, and then its submit was refused
    ("The server is shutting down.", a 503). The pool marks a model's link once it tells that
    model's worker to drain, when nothing of its own waits or runs."""
    from scheduler.link import pool as pool_module
    from scheduler.link.messages import Rejected
    from scheduler.management.commands.serve import Drain, PoolWorkers

    pool, spawned = two_models()
    loop_id = id(asyncio.get_running_loop())
    pool_module._POOLS[loop_id] = pool  # PoolWorkers drains every pool of the process
    try:
        first = await running(pool, "a")
        second = asyncio.ensure_future(pool.acquire("a", 0))
        await settle()
        drain = Drain(PoolWorkers(), lambda: [pool.link, *pool.open_links.values()], 60.0)  # type: ignore[arg-type]
        drain.begin()
        assert pool.link.draining and pool.draining  # nothing new is taken
        pool.release(first)
        link, _d, ticket = await asyncio.wait_for(second, 10)
        handle = await link.submit(request={"endpoint": "completions", "model": "a", "prompt": "hi", "max_tokens": 1}, qos=2, priority=0)
        assert handle.events.empty(), handle.events.get_nowait()  # sent, not Rejected(shutting_down)
        assert not spawned["a"][0].drained and not link.draining
        await link.cancel(handle)
        link.finish(handle)
        pool.release(ticket)
        assert spawned["a"][0].drained and link.draining  # told once nothing of its own is left
        late = await link.submit(request={"endpoint": "completions", "model": "a", "prompt": "hi", "max_tokens": 1}, qos=2, priority=0)
        assert isinstance(late.events.get_nowait(), Rejected)
    finally:
        pool_module._POOLS.pop(loop_id, None)


async def test_a_worker_not_ready_within_the_health_check_timeout_fails_its_requests_and_is_killed() -> None:
    """A worker that hangs mid-load (a stuck disk, a deadlocked start-up) never says hello: its
    requests waited with no end, and so did every request for another model behind it once the
    router had no room. llama-swap's healthCheckTimeout bounds the load (shortened here)."""
    pool, spawned = two_models()
    pool.config = dataclasses.replace(pool.config, load_timeout_s=0.05)
    with pytest.raises(ModelUnavailable, match=r"not ready within 0.05 s \(healthCheckTimeout\)"):
        await asyncio.wait_for(pool.acquire("a", 0), 10)
    [hung] = spawned["a"]
    assert hung.exited.is_set()  # killed, not left loading beside a later load
    assert "a" not in pool.links and "a" not in pool.workers and not pool.router.state("a").resident
    waiting = asyncio.ensure_future(pool.acquire("b", 0))  # the slot it held is free
    await settle()
    await loaded(pool, "b")
    _link, _d, ticket = await asyncio.wait_for(waiting, 10)
    pool.release(ticket)
    pool.kill()


async def test_requests_waiting_for_a_load_reach_the_dashboard_with_no_worker_connected(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard is pushed when a worker's snapshot arrives; with no model loaded none
    comes, so the page's router queue never showed the requests waiting for a load. The
    router's tick pushes its view while any wait, and once more when none does."""
    from dashboard.feed import full_state
    from scheduler.link import pool as pool_module

    pool, _spawned = two_models()  # a's worker never says hello: it stays loading
    pushed: list[dict[str, Any]] = []
    monkeypatch.setattr(pool_module, "SNAPSHOT_LISTENERS", [pushed.append])
    monkeypatch.setitem(pool_module._POOLS, id(asyncio.get_running_loop()), pool)
    pool.start()

    async def pushed_more_than(n: int) -> None:
        while len(pushed) <= n:  # the router's tick, every TICK_S
            await asyncio.sleep(0.05)

    try:
        waiting = asyncio.ensure_future(pool.acquire("a", 0))
        await asyncio.wait_for(pushed_more_than(0), 10)
        assert full_state(pushed[-1])["router_queue"]["normal"]["depth"] == 1  # what the page draws
        waiting.cancel()
        shown = len(pushed)
        await asyncio.wait_for(pushed_more_than(shown), 10)
        assert full_state(pushed[-1])["router_queue"]["normal"]["depth"] == 0
        shown = len(pushed)
        pool._push_router_queue()  # a tick with nothing waiting, shown so: no push
        assert len(pushed) == shown
    finally:
        pool.kill()
        if pool._ticker is not None:
            pool._ticker.cancel()
