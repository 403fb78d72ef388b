"""A key's concurrency slot while its streamed request goes on at a second worker (the first one
crashed and the link resubmitted the job): the request is the same one, admitted once, and its
slot stays held until its response ends, so the key's ``max_concurrent`` counts it all along."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from channels.testing import HttpCommunicator

from keys.credentials import digest_of
from keys.runtime import Key, KeyRuntime, Policy, Snapshot
from scheduler.core.qos import QosClass
from scheduler.core.types import TickPlan, TickResult
from scheduler.engines.sim import SimEngine
from superfluid_site.runtime import forget, install, web_runtime
from tests.link.conftest import transport

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-one-at-a-time-0123456789"
NAME = "one-at-a-time"


class Crash(SimEngine):
    """The first worker: a few ticks of tokens, then it dies."""

    def execute(self, plan: TickPlan, should_stop: Any) -> TickResult:
        result = super().execute(plan, should_stop)
        if len(self.calls) >= 5:
            raise RuntimeError("simulated engine crash")
        return result


class Watching(SimEngine):
    """The second worker: notes the key's slots held on the web side at each of its ticks that
    run the job (feed it tokens); a tick after its end that only keeps the freed lane's KV may
    come once the response has ended and the slot is back."""

    def __init__(self, rt: KeyRuntime, seen: list[int]) -> None:
        super().__init__(n_lanes=2, lane_ctx=512)
        self.rt, self.seen = rt, seen

    def execute(self, plan: TickPlan, should_stop: Any) -> TickResult:
        if plan.feeds:
            self.seen.append(self.rt.slots.held.get(NAME, 0))
        return super().execute(plan, should_stop)


async def test_a_stream_resubmitted_after_its_worker_crashed_keeps_its_keys_slot() -> None:
    import api.consumers as consumers

    loop = asyncio.get_running_loop()
    rt = KeyRuntime(loop, watch=False)
    policy = Policy(name="p", max_class=QosClass.INTERACTIVE, max_concurrent=1)
    rt.snapshot = Snapshot(version=1, keys_by_digest={digest_of(SECRET): Key(id=1, name=NAME, digest=digest_of(SECRET), policy=policy)})
    rt.loaded.set()
    rt.touch = lambda key: None  # type: ignore[method-assign]
    seen: list[int] = []
    engines: list[SimEngine] = []

    def make() -> SimEngine:
        engines.append(Crash(n_lanes=2, lane_ctx=512) if not engines else Watching(rt, seen))
        return engines[-1]

    async def keep(record: Any) -> None:
        pass

    original = consumers.record_request
    consumers.record_request = keep  # type: ignore[assignment]
    link = install(transport(make))
    web_runtime().set_keys(rt)
    try:
        assert await link.wait_connected(5)
        from superfluid_site.asgi import application

        body = json.dumps({"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "stream": True}).encode()
        headers = [(b"content-type", b"application/json"), (b"host", b"127.0.0.1"), (b"authorization", f"Bearer {SECRET}".encode())]
        began = time.monotonic()
        response = await HttpCommunicator(application, "POST", "/v1/chat/completions", body=body, headers=headers).get_response(timeout=30)
        assert response["status"] == 200, response["body"]
        assert time.monotonic() - began < 30
        assert link.restarts == 1  # the job went on at a second worker
    finally:
        consumers.record_request = original  # type: ignore[assignment]
        await link.stop()
        forget(loop)
    assert seen and all(n == 1 for n in seen), seen  # held all through the second worker's run
    assert rt.slots.held.get(NAME, 0) == 0  # and given back when the response ended
