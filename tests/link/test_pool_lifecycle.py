"""The several-models pool (scheduler/link/pool.py): what happens to a model's worker process
when it is unloaded while serve exits, and when its supervisor fails half-way through starting."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from scheduler.link.pool import ModelUnavailable

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
