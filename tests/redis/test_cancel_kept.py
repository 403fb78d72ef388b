"""A client that goes away while its request waits on Redis is cancelled, wherever the cancel
lands. On Python 3.11 redis-py's socket writes go through ``asyncio.wait_for``, which returned
normally when the cancel landed just as the write completed (CPython gh-86296): the request then
went on, admitted and submitted, for nobody. Each case sweeps the cancel over the first turns of
the event loop after the call starts, with Redis kept busy so that no reply can end it first."""

from __future__ import annotations

import asyncio

import redis

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
