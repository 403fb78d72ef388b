"""The several-models pool (scheduler/link/pool.py) when a model's worker is given up for good
(the pool's ``_load_failed``: its supervisor's ``on_fatal``) in the same event-loop step that
dispatched a request waiting at the router, before that request's ``acquire`` resumed.

serve's ``WorkerSupervisor`` calls ``on_fatal`` only for a worker that never reported ready, which
it does before its hello, so with it no request is dispatched to such a model today; the pool's
``Worker`` protocol does not promise that, and this is what the pool does if it comes later."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.engines.sim import FakeClock
from scheduler.link.pool import ModelUnavailable

from .test_pool_failures import running, settle, two_models


async def test_a_worker_dying_as_its_request_is_dispatched_fails_the_request_and_frees_its_lane() -> None:
    """``acquire`` read ``self.links[model]`` after the dispatch: the dead worker's link was gone,
    a KeyError (a 500) came out of it instead of ModelUnavailable (a 503 with the reason), and
    the request stayed counted as running at the model for good (no ticket came back to release):
    the admin showed it running, its lane was never free again, and the model never idle."""
    clock = FakeClock()
    pool, spawned = two_models(clock=clock)
    first = await running(pool, "a")
    second = asyncio.ensure_future(pool.acquire("a", 0))  # waits for a's only lane
    await settle()
    assert not second.done()
    pool.release(first)  # the lane frees: ``second`` is dispatched, its task not yet resumed
    worker = spawned["a"][0]
    worker.fatal = "its worker exited"
    pool._load_failed("a", worker)  # on_fatal's callback, queued before that task's wake-up
    with pytest.raises(ModelUnavailable, match="could not be loaded") as failed:
        await asyncio.wait_for(second, 10)
    # the router's pick goes with the error, for the request's activity row
    assert failed.value.dispatch is not None
    assert failed.value.dispatch.serial_fields().keys() == {"serial_priority", "serial_band", "serial_score", "serial_queue_wait_ms"}
    model = pool.router.snapshot()["models"]["a"]  # type: ignore[index]
    assert model["inflight"] == 0 and model["lanes_taken"] == 0
    assert pool.router.idle("a") and pool.router._dispatched == {}
    # the model can be used again: a new request (once the failure's backoff has passed) loads it and gets its lane
    clock.advance(pool.router.backoff_left("a"))
    third = asyncio.ensure_future(pool.acquire("a", 0))
    await settle()
    pool.links["a"]._connected.set()
    await settle()
    _link, _d, ticket = await asyncio.wait_for(third, 10)
    pool.release(ticket)
    assert pool.router.idle("a")
    pool.kill()
