"""The key watcher stops when it is cancelled, wherever the cancel lands. Its wait for the next
poke was an ``asyncio.wait_for``, which on Python 3.11 returns normally when its task is
cancelled just as the poke arrives (CPython gh-86296): the watcher then went on polling, and
``KeyRuntime.stop`` (serve's exit) waited for it for good."""

from __future__ import annotations

import asyncio

from keys.runtime import KeyRuntime


async def test_a_cancel_that_lands_as_a_poke_arrives_still_stops_the_watcher() -> None:
    for turns in range(6):
        rt = KeyRuntime(asyncio.get_running_loop())
        refreshed = 0

        async def refresh() -> None:  # the database's part is not what is tested here
            nonlocal refreshed
            refreshed += 1

        rt.refresh = refresh  # type: ignore[method-assign]
        rt.start()
        while refreshed == 0:  # the first read done: it waits for a poke
            await asyncio.sleep(0)
        for _ in range(3):
            await asyncio.sleep(0)
        rt.poke.set()  # a change committed (the admin) ...
        for _ in range(turns):
            await asyncio.sleep(0)
        task = rt._task
        assert task is not None
        task.cancel()  # ... as serve exits
        done, _pending = await asyncio.wait({task}, timeout=5)  # the timeout only bounds the hang
        assert task in done, f"the watcher went on after its cancel (cancelled {turns} turns after the poke)"
