"""A client that goes away while its request waits on Redis is cancelled, wherever the cancel
lands. On Python 3.11 redis-py's socket writes go through ``asyncio.wait_for``, which returned
normally when the cancel landed just as the write completed (CPython gh-86296): the request then
went on, admitted and submitted, for nobody. Each case sweeps the cancel over the first turns of
the event loop after the call starts, with Redis kept busy so that no reply can end it first."""

from __future__ import annotations

import asyncio
import time

import redis

from scheduler.engines.sim import SimEngine
from scheduler.link.transport import JobHandle
from tests.keys.test_admission import IP, admit, chat

from .conftest import Busy, RedisServer, SimFleetWorker, completion, head
from .test_admission_shared import a_head_of_one_place_a_client

TURNS = range(8)


async def cancelled_after(turns: int, coro: object) -> BaseException | object:
    task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    [ended] = await asyncio.gather(task, return_exceptions=True)
    return ended


async def test_a_limits_check_cancelled_at_any_turn_is_cancelled_and_holds_nothing(redis_server: RedisServer) -> None:
    async with a_head_of_one_place_a_client(redis_server) as (_admin, head_rt):
        for turns in TURNS:
            busy = Busy(redis_server.port, 300)
            try:
                ended = await cancelled_after(turns, admit({}, IP, chat(), runtime=head_rt))
                assert isinstance(ended, asyncio.CancelledError), (turns, ended)
                assert head_rt.in_flight.held == {}
            finally:
                await asyncio.to_thread(busy.join)


async def test_a_submit_cancelled_at_any_turn_is_cancelled_and_leaves_no_job(redis_server: RedisServer, prefix: str) -> None:
    worker = SimFleetWorker(redis_server.url, prefix).start()
    link = await head(redis_server.url, prefix)
    admin = redis.Redis.from_url(redis_server.url)
    try:
        for turns in TURNS:
            busy = Busy(redis_server.port, 300)
            try:
                ended = await cancelled_after(turns, link.submit(request=completion("nobody", max_tokens=200)))
                assert isinstance(ended, asyncio.CancelledError), (turns, ended)
                assert link.open == set() and link.inflight == {}
            finally:
                await asyncio.to_thread(busy.join)
        deadline = asyncio.get_running_loop().time() + 10
        while [k for k in admin.scan_iter(f"{prefix}job:*")] or worker.link.held:  # each was cancelled
            assert asyncio.get_running_loop().time() < deadline, list(admin.scan_iter(f"{prefix}job:*"))
            await asyncio.sleep(0.02)
    finally:
        admin.close()
        await link.stop()
        worker.stop()


async def test_a_cancel_cut_short_by_a_second_cancel_at_any_turn_still_ends_the_job(redis_server: RedisServer, prefix: str) -> None:
    """A consumer whose client left sends its job's cancel from its clean-up, and can be cancelled
    again meanwhile (daphne cancels an application still running past its close timeout). A
    second cancel that landed before the cancel's Redis call was written (a call that must open
    a connection first, as every one does when the pool's are in use) cut it off: the job ran on
    to its last token for nobody, holding a lane. Each case cancels the clean-up a second time
    after a number of event-loop turns."""
    engine = SimEngine(n_lanes=2, lane_ctx=512)
    engine.on_call = lambda _n: time.sleep(0.005)  # 400 tokens: about two seconds a job
    worker = SimFleetWorker(redis_server.url, prefix, engine=engine).start()
    link = await head(redis_server.url, prefix)
    send_cancel = link.scripts.cancel

    async def connecting_first(args: list[object]) -> object:
        for _ in range(3):  # the turns a new pooled connection takes before the command goes
            await asyncio.sleep(0)
        return await send_cancel(args)

    link.scripts.cancel = connecting_first
    try:
        for turns in TURNS:
            handle = await link.submit(request=completion("nobody", max_tokens=400))
            while handle.job_id not in worker.link.held:  # at the worker, running
                await asyncio.sleep(0.01)

            async def streaming(handle: JobHandle = handle) -> None:
                try:
                    await asyncio.Event().wait()  # the reply's stream, until the client leaves
                except asyncio.CancelledError:
                    await link.cancel(handle)  # as api/consumers.py does
                    raise
                finally:
                    link.finish(handle)

            task = asyncio.get_running_loop().create_task(streaming())
            await asyncio.sleep(0)
            task.cancel()  # the client left
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()  # and the clean-up is cancelled too
            [ended] = await asyncio.gather(task, return_exceptions=True)
            assert isinstance(ended, asyncio.CancelledError), (turns, ended)

        def finishes() -> dict[str, int]:
            out: dict[str, int] = {}
            for by_reason in list(worker.worker.metrics.finishes.values()):
                for reason, n in list(by_reason.items()):
                    out[reason] = out.get(reason, 0) + n
            return out

        deadline = asyncio.get_running_loop().time() + 60
        while sum(finishes().values()) < len(TURNS):  # every job ended, one way or the other
            assert asyncio.get_running_loop().time() < deadline, finishes()
            await asyncio.sleep(0.02)
        assert finishes() == {"cancelled": len(TURNS)}  # none ran to its length
    finally:
        await link.stop()
        worker.stop()
