"""The several-models pool (scheduler/link/pool.py) carries out the router's request-priority
order (seed: request-priority): the priority it is given orders requests across models, a TTL
unload waits for the model's work, an alias queues with its model. No processes, no sockets."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from scheduler.core.router import ModelState
from scheduler.engines.sim import FakeClock
from scheduler.link.pool import ModelPool, PoolSetup
from scheduler.models_config import ModelsConfig, ServedModel

from .test_pool_failures import Startable, loaded, running, settle, two_models
from .test_pool_lifecycle import until


async def test_the_pool_dispatches_in_score_order_with_the_priority_it_is_given() -> None:
    """One slot, one lane each, a busy. With the bonus (10) a second request for a goes before
    an older one for b that needs a swap; then a request for b at 100 goes before a queued one
    for a at 0, and the older b at 0 after it: a is swapped out once."""
    pool, spawned = two_models()
    first = await running(pool, "a")
    b_normal = asyncio.ensure_future(pool.acquire("b", 0))
    await settle()
    a_second = asyncio.ensure_future(pool.acquire("a", 0))
    await settle()
    assert not b_normal.done() and not a_second.done()
    pool.release(first)
    _link, dispatch, a_second_ticket = await asyncio.wait_for(a_second, 10)
    assert dispatch.score >= 10 and not b_normal.done()
    a_third = asyncio.ensure_future(pool.acquire("a", 0))
    b_high = asyncio.ensure_future(pool.acquire("b", 100))
    await settle()
    pool.release(a_second_ticket)
    await until(lambda: "b" in pool.links, "b's load started")
    await loaded(pool, "b")
    link, dispatch, b_high_ticket = await asyncio.wait_for(b_high, 10)
    assert link is pool.links["b"] and dispatch.priority == 100 and dispatch.band == "interactive"
    assert not b_normal.done() and not a_third.done()  # b's one lane is taken
    pool.release(b_high_ticket)
    _link, _d, b_normal_ticket = await asyncio.wait_for(b_normal, 10)
    assert not a_third.done()
    pool.release(b_normal_ticket)
    await until(lambda: "a" in pool.links, "a loaded again")
    await loaded(pool, "a")
    _link, _d, ticket = await asyncio.wait_for(a_third, 10)
    pool.release(ticket)
    assert len(spawned["a"]) == 2 and len(spawned["b"]) == 1
    pool.kill()


async def test_a_ttl_unload_waits_for_the_models_running_and_waiting_work() -> None:
    clock = FakeClock()
    workers: list[Startable] = []

    def spawn(_model: str, _sockets: Any) -> Startable:
        workers.append(Startable())
        return workers[-1]

    cfg = ModelsConfig((ServedModel("a", Path("/m/a.gguf"), ttl_s=5),))
    pool = ModelPool(PoolSetup(cfg, spawn=spawn, lanes={"a": 1}, ctx_sizes={"a": 512}), clock=clock)
    first = await running(pool, "a")
    second = asyncio.ensure_future(pool.acquire("a", 0))  # waits for a's one lane
    await settle()
    clock.advance(60)
    pool.kick()  # the router's tick
    assert pool.router.state("a") is ModelState.LOADED and not workers[0].drained
    pool.release(first)
    _link, _d, ticket = await asyncio.wait_for(second, 10)
    clock.advance(60)
    pool.kick()
    assert pool.router.state("a") is ModelState.LOADED and not workers[0].drained
    pool.release(ticket)
    clock.advance(4)
    pool.kick()
    assert pool.router.state("a") is ModelState.LOADED
    clock.advance(2)
    pool.kick()
    await until(lambda: pool.router.state("a") is ModelState.UNLOADED, "a unloaded by its TTL")
    assert workers[0].drained and "a" not in pool.links and len(workers) == 1


async def test_an_alias_is_routed_to_its_models_queue_and_an_unknown_name_to_none() -> None:
    cfg = ModelsConfig((ServedModel("a", Path("/m/a.gguf"), aliases=("small",)), ServedModel("b", Path("/m/b.gguf"))))
    pool = ModelPool(PoolSetup(cfg, spawn=lambda _m, _s: Startable(), lanes={"a": 1, "b": 1}))
    assert pool.route("small", fim=False) == pool.route("a", fim=False) == "a"
    assert pool.route("nope", fim=False) is None and pool.route("A", fim=False) is None
