"""A client that goes away while its request waits on Redis is cancelled, wherever the cancel
lands. On Python 3.11 redis-py's socket writes go through ``asyncio.wait_for``, which returned
normally when the cancel landed just as the write completed (CPython gh-86296): the request then
went on, admitted and submitted, for nobody. Each case sweeps the cancel over the first turns of
the event loop after the call starts, with Redis kept busy so that no reply can end it first."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any

import redis

from scheduler.engines.sim import SimEngine
from scheduler.link.messages import Submit
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
            # admitted at the worker, so running: not only picked (``held``) and maybe still being
            # prepared, where a cancel drops it unadmitted, counted neither as a request nor as a
            # finish (a loaded machine prepares late), and the wait below never saw it end
            deadline = asyncio.get_running_loop().time() + 30
            while handle.job_id not in worker.worker.contexts:
                assert asyncio.get_running_loop().time() < deadline, (turns, "the job was never admitted")
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


class RecordingInbox(queue.SimpleQueue):  # type: ignore[type-arg]
    """A worker's inbox that keeps the order of what went in: (message type, job id)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str]] = []

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        conn, message = item
        self.log.append((type(message).__name__, str(getattr(message, "id", getattr(conn, "job_id", "")))))
        super().put(item, block, timeout)


async def test_a_cancel_that_reaches_the_worker_as_it_takes_the_job_in_still_ends_the_job(redis_server: RedisServer, prefix: str) -> None:
    """A worker that has just picked a job holds it (``held``), then hands its Submit to the
    worker loop's inbox. A cancel for it that came in between took it out of ``held`` and put
    its Cancel in the inbox ahead of the Submit: the loop found no such job, then ran the Submit
    to its last token for nobody, holding a lane (its messages were no longer emitted, so
    nothing fenced it). Here the pulling thread is held as it takes the job in (in the worker's
    ``_on_message``, just before that hand-over) until the cancel has been dealt with."""
    engine = SimEngine(n_lanes=2, lane_ctx=512)
    engine.on_call = lambda _n: time.sleep(0.005)  # 400 tokens: about two seconds
    worker = SimFleetWorker(redis_server.url, prefix, engine=engine)
    inbox = worker.worker.inbox = RecordingInbox()
    picked, go_on = threading.Event(), threading.Event()
    on_message = worker.worker._on_message

    def taking_in(message: Any) -> None:  # on the pulling thread, before the Submit goes in
        on_message(message)
        if isinstance(message, Submit):
            picked.set()
            go_on.wait(10)

    worker.worker._on_message = taking_in  # type: ignore[method-assign]
    worker.start()
    link = await head(redis_server.url, prefix)
    try:
        handle = await link.submit(request=completion("nobody", max_tokens=400))
        assert await asyncio.to_thread(picked.wait, 10), "the worker never picked the job"
        await link.cancel(handle)  # as api/consumers.py does when the client has left
        link.finish(handle)
        deadline = asyncio.get_running_loop().time() + 10
        while handle.job_id in worker.link.held:  # the cancel has reached the worker (if it held the job)
            assert asyncio.get_running_loop().time() < deadline, "the cancel never reached the worker"
            await asyncio.sleep(0.01)
        go_on.set()

        def idle() -> bool:
            w = worker.worker
            return ("Submit", handle.job_id) in inbox.log and inbox.empty() and not w.contexts and not w.preparing and not w.scheduler.jobs and not worker.link.held

        deadline = asyncio.get_running_loop().time() + 30
        while not idle():  # the job ended at the worker, one way or the other
            assert asyncio.get_running_loop().time() < deadline, (inbox.log, dict(worker.worker.metrics.finishes))
            await asyncio.sleep(0.02)
        finishes = {reason for by_reason in worker.worker.metrics.finishes.values() for reason in by_reason}
        assert finishes <= {"cancelled"}, (finishes, inbox.log)  # it did not run to its length
    finally:
        go_on.set()
        await link.stop()
        worker.stop()
