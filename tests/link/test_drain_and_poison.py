"""The link and the worker loop at their edges: a drain that lands on a job on its way, a poison job beside others."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from scheduler.engines.base import TickPlan, TickResult
from scheduler.engines.sim import SimEngine
from scheduler.link.messages import Done

from .conftest import RecordingCarrier, completion, hello, outcome, transport


class GatedSim(SimEngine):
    """A tick that waits for ``gate`` once ``hold`` is set: the worker is mid-tick for as long
    as the test wants (a prompt step on a CPU takes a second or more)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(n_lanes=2, lane_ctx=512, **kwargs)
        self.hold = threading.Event()
        self.in_tick = threading.Event()
        self.gate = threading.Event()

    def execute(self, plan: TickPlan, should_stop: Any) -> TickResult:
        if self.hold.is_set():
            self.in_tick.set()
            self.gate.wait(10)
        return super().execute(plan, should_stop)


async def test_a_job_submitted_before_the_drain_began_is_served_though_the_worker_was_mid_tick() -> None:
    """serve's SIGTERM reaches the worker at once, while the link's last submits wait in its
    inbox for the tick in flight (a prompt step on a CPU: a second or more). Those requests were
    accepted before the drain began; the worker refused them (503) once it drained its inbox."""
    engines: list[GatedSim] = []
    link = transport(lambda: engines.append(GatedSim()) or engines[-1], drain_timeout_s=10)
    link.start()
    while not engines:
        await asyncio.sleep(0.01)
    engine = engines[0]
    engine.hold.set()  # the first tick waits for the gate
    first = await link.submit(request=completion(max_tokens=20))
    assert await asyncio.get_running_loop().run_in_executor(None, engine.in_tick.wait, 10)
    second = await link.submit(request=completion("A second story", max_tokens=5))  # on its way
    link.drain()  # SIGTERM while the submit waits in the worker's inbox
    engine.gate.set()
    _, end_first = await outcome(first)
    _, end_second = await outcome(second)
    assert isinstance(end_first, Done), end_first
    assert isinstance(end_second, Done), end_second
    await link.stop()


async def test_a_poison_job_fails_alone_and_the_jobs_beside_it_carry_on() -> None:
    """A prompt that crashes the engine costs two restarts and fails alone: a job that happened
    to be at the same worker during both crashes (submitted beside it, prefilled in the same
    ticks) is not the poison, and carries on."""
    from scheduler.link.messages import Error

    from .test_transport import CrashingSim

    link = transport(lambda: CrashingSim(poison=b"POISON"))
    innocent = await link.submit(request=completion("An innocent story", max_tokens=30))
    poison = await link.submit(request=completion("a POISON prompt", max_tokens=30))
    (_, end_poison), (text, end_innocent) = await asyncio.gather(outcome(poison), outcome(innocent))
    link.finish(innocent)
    link.finish(poison)
    assert isinstance(end_poison, Error) and end_poison.reason == "engine_crashed"
    assert isinstance(end_innocent, Done), end_innocent
    assert end_innocent.usage["completion_tokens"] == 30
    await link.stop()


async def test_after_a_crash_the_jobs_go_back_one_at_a_time_the_best_class_first() -> None:
    """A chat that was at the lost worker beside background jobs is not sent back last, behind
    their prompts: the one-at-a-time resend takes the best class first."""
    import time

    from scheduler.link.messages import Delta, Submit

    link = RecordingCarrier()
    await link._on_hello(hello(1, lanes=4))
    background = [await link.submit(request=completion(f"bg {i}"), qos=3) for i in range(2)]
    chat = await link.submit(request=completion("chat"), qos=0)
    link._on_lost(time.monotonic())
    link.sent.clear()
    await link._on_hello(hello(2, lanes=4))
    assert [m.id for m in link.sent if isinstance(m, Submit)] == [chat.job_id]
    link._on_message(Delta(chat.job_id, "x", 1))
    while len([m for m in link.sent if isinstance(m, Submit)]) < 2:
        await asyncio.sleep(0)
    assert [m.id for m in link.sent if isinstance(m, Submit)] == [chat.job_id, background[0].job_id]
