"""A second cancel while a response is cleaning up after its client left (daphne cancels an
application that outlived its close timeout, or at shutdown, while its disconnect's clean-up is
still sending the cancels): every job of the request is still cancelled at the worker."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from channels.testing import ApplicationCommunicator

from scheduler.link.messages import Cancel, decode

from .inproc import JSON, MODEL, SimWorker, application, attached, chat_body, scope
from .test_middle_layer import wait_idle

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", chat_body("three stories", n=3, max_tokens=400, stream=True)),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": ["a", "b", "c"], "max_tokens": 400}).encode()),
    ],
    ids=["chat-n3-stream", "completions-3-prompts"],
)
async def test_a_second_cancel_during_a_disconnects_clean_up_still_cancels_every_choice(path: str, body: bytes) -> None:
    """n=3 (or three prompts): the client leaves, and while the first choice's Cancel is on its
    way (a full socket), the server cancels the application too, and again a second later. The
    clean-up stopped at that first Cancel: the other choices' jobs were never cancelled and ran
    to their max_tokens for nobody, holding lanes."""
    sim = SimWorker(lanes=2, step_sleep_s=0.003)
    async with attached(sim) as (link, _rt):
        gate = asyncio.Event()
        cancels: list[str] = []
        real_send = link._send

        async def slow_cancels(data: bytes) -> None:
            message = decode(data)
            if isinstance(message, Cancel):
                cancels.append(message.id)
                await gate.wait()  # each Cancel waits for room on the socket
            await real_send(data)

        link._send = slow_cancels  # type: ignore[method-assign]
        comm = ApplicationCommunicator(application(), scope("POST", path, JSON))
        await comm.send_input({"type": "http.request", "body": body, "more_body": False})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while sim.busy()[0] < 2 or len(link.inflight) < 3:  # every job submitted, two on lanes
            assert loop.time() < deadline, (sim.busy(), list(link.inflight))
            await asyncio.sleep(0.005)
        jobs = set(link.inflight)
        await comm.send_input({"type": "http.disconnect"})
        while not cancels:  # the clean-up is sending the first Cancel
            assert loop.time() < deadline, "no cancel was sent"
            await asyncio.sleep(0.001)
        for more in (2, 3):  # the server gives up on the application (daphne: again every second while it runs)
            comm.future.cancel()
            wait_until = loop.time() + 2
            while len(cancels) < more and loop.time() < wait_until:  # the next choice's Cancel, if it comes
                await asyncio.sleep(0.001)
        gate.set()
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await comm.wait(5)
        assert await wait_idle(sim, link) == (0, 0)
        assert set(cancels) == jobs, (cancels, jobs)  # every choice's job had its Cancel sent
        worker: Any = link.worker
        assert worker.scheduler.counters["cancelled"] == 3  # none ran on to its end
        assert not link.inflight and not link.open
