"""asyncio helpers shared by the web side's parts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def spawn(tasks: set[asyncio.Task[Any]], coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Run ``coro`` as a task of the running loop, held in ``tasks`` until it ends: the loop
    keeps only a weak reference to a task, so one that nothing holds may be collected midway."""
    task = asyncio.get_running_loop().create_task(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task


async def keeping_cancel(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` (a redis-py call) without losing a cancel of the calling task.

    On Python 3.11, ``asyncio.wait_for`` returns normally when its task is cancelled just as the
    future it waits on completes (CPython gh-86296, fixed in 3.12), and redis-py wraps every
    socket write in one. A client that went away at that moment was not cancelled: its request
    went on to run for nobody. The task still counts the cancel it was asked for
    (``Task.cancelling()``); this raises it once the call is back."""
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    result = await awaitable
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError
    return result
