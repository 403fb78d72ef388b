"""The transport seam, in process: submit, events, cancel, worker loss, poison jobs, drain."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from scheduler.engines.base import TickPlan, TickResult
from scheduler.engines.sim import SimEngine
from scheduler.link.inprocess import InProcessTransport
from scheduler.link.messages import (
    ENGINE_CRASHED,
    SHUTDOWN,
    UNENCODABLE,
    Accepted,
    Config,
    Delta,
    Done,
    Error,
    Rejected,
)

from .conftest import RecordingCarrier, completion, hello, outcome, run_one, sim_worker, transport


class CrashingSim(SimEngine):
    """Raises out of ``execute`` (the in-process picture of llama.cpp taking its process down)
    after ``crash_after`` calls, or on any call once a lane holds ``poison``."""

    def __init__(self, *, crash_after: int = 0, poison: bytes = b"", **kwargs: Any) -> None:
        super().__init__(n_lanes=2, lane_ctx=512, **kwargs)
        self.crash_after, self.poison = crash_after, poison

    def execute(self, plan: TickPlan, should_stop: Any) -> TickResult:
        result = super().execute(plan, should_stop)
        if self.crash_after and len(self.calls) >= self.crash_after:
            raise RuntimeError("simulated engine crash")
        if self.poison and any(self.poison in bytes(t % 256 for t in kv) for kv in self.kv):
            raise RuntimeError("simulated crash on a poison prompt")
        return result


async def test_a_job_streams_deltas_then_done_with_usage() -> None:
    link = transport()
    first = await link.submit(request=completion(max_tokens=12))
    events = [await first.next_event()]
    while not isinstance(events[-1], Done):
        events.append(await first.next_event())
    link.finish(first)
    assert isinstance(events[0], Accepted) and events[0].prompt_tokens == len("Once upon a time")
    text = "".join(e.text for e in events if isinstance(e, Delta))
    done = events[-1]
    assert done.finish_reason == "length" and done.usage["completion_tokens"] == 12 and len(text) == 12
    assert link.inflight == {} and link.open == set()
    await link.stop()


async def test_a_job_that_cannot_be_encoded_fails_alone_and_is_never_registered() -> None:
    link = transport()
    bad = await link.submit(request=completion("\ud800 lone surrogate"))
    event = await bad.next_event()
    assert isinstance(event, Rejected) and event.reason == UNENCODABLE
    assert bad.job_id not in link.inflight and bad.job_id not in link.open
    text, done = await run_one(link, request=completion(max_tokens=8))
    assert isinstance(done, Done) and len(text) == 8
    await link.stop()


async def test_a_job_in_flight_when_the_worker_dies_continues_from_the_text_delivered() -> None:
    undisturbed = transport()
    reference, _ = await run_one(undisturbed, request=completion(max_tokens=60))
    await undisturbed.stop()

    engines: list[CrashingSim] = []

    def make() -> CrashingSim:
        engines.append(CrashingSim(crash_after=20 if not engines else 0))  # the first worker dies
        return engines[-1]

    link = transport(make)
    text, done = await run_one(link, request=completion(max_tokens=60))
    assert link.restarts == 1 and link.worker_restarts == 0  # in process: the same pid says hello
    assert isinstance(done, Done) and done.usage["completion_tokens"] == 60
    assert text == reference
    await link.stop()


async def test_a_poison_job_fails_with_engine_crashed_after_two_crashes_and_the_next_job_is_served() -> None:
    link = transport(lambda: CrashingSim(poison=b"POISON"))
    text, event = await run_one(link, request=completion("a POISON prompt"))
    assert isinstance(event, Error) and event.reason == ENGINE_CRASHED and text == ""
    assert link.restarts == 2  # not a third time
    text, done = await run_one(link, request=completion(max_tokens=5))
    assert isinstance(done, Done) and len(text) == 5
    assert link.restarts == 2
    await link.stop()


async def test_cancel_frees_the_lane() -> None:
    slow = lambda: _slow_sim(0.01)  # noqa: E731
    link = transport(slow)
    handle = await link.submit(request=completion(max_tokens=400))
    while not isinstance(await handle.next_event(), Delta):
        pass
    await link.cancel(handle)
    assert handle.job_id not in link.inflight
    while (link.snapshot or {}).get("lanes_active", 1) != 0:
        await asyncio.sleep(0.01)
    await link.stop()


def _slow_sim(seconds_per_call: float) -> SimEngine:
    engine = SimEngine(n_lanes=2, lane_ctx=512)
    engine.on_call = lambda n: time.sleep(seconds_per_call)
    return engine


async def test_a_drain_that_runs_out_of_time_ends_every_job_with_a_shutdown_error() -> None:
    link = transport(lambda: _slow_sim(0.01), drain_timeout_s=0.2)
    handle = await link.submit(request=completion(max_tokens=400))
    while not isinstance(await handle.next_event(), Delta):
        pass
    link.drain()
    text, event = await outcome(handle)
    assert isinstance(event, Error) and event.reason == SHUTDOWN
    await asyncio.wait_for(link.exited.wait(), 10)
    assert link.restarts == 0 and link.inflight == {}  # a drained worker is not replaced
    await link.stop()


async def test_config_is_sent_before_jobs_and_again_to_a_new_worker() -> None:
    engines: list[CrashingSim] = []

    def make() -> CrashingSim:
        engines.append(CrashingSim(crash_after=3 if not engines else 0))
        return engines[-1]

    workers: list[Any] = []

    def make_worker() -> Any:
        workers.append(sim_worker(make()))
        return workers[-1]

    link = InProcessTransport(make_worker)
    await link.configure(Config(class_lanes={"background": 1}))
    await run_one(link, request=completion(max_tokens=30))
    assert len(workers) == 2
    assert all(w.snapshot()["class_lanes"] == {"background": 1} for w in workers)
    await link.stop()


async def test_prompts_are_tokenised_on_the_preparation_thread_not_the_tick_thread() -> None:
    threads: set[str] = set()

    class Watched(SimEngine):
        def tokenize(self, text: str, **kwargs: Any) -> list[int]:
            threads.add(threading.current_thread().name)
            return super().tokenize(text, **kwargs)

    link = transport(lambda: Watched(n_lanes=2, lane_ctx=512))
    text, done = await run_one(link, request=completion(max_tokens=4))
    assert isinstance(done, Done)
    assert threads == {"prepare"}
    await link.stop()



async def test_a_job_cancelled_while_a_restarted_worker_gets_the_resubmissions_is_not_sent_again() -> None:
    """Resubmitting the jobs in flight to a worker that came back awaits each send (a full
    socket pauses it). A job cancelled during that pause used to be resubmitted after its cancel,
    and the worker ran it for nobody. A job submitted meanwhile goes once, by its submit."""
    from scheduler.link.messages import Cancel, Submit

    link = RecordingCarrier()
    await link._on_hello(hello(1))
    jobs = [await link.submit(request=completion(f"job {i}")) for i in range(3)]
    link._on_lost(time.monotonic())
    link.sent.clear()
    link.pause_on = jobs[0].job_id  # the first resubmission's send pauses
    resubmitting = asyncio.get_running_loop().create_task(link._on_hello(hello(2)))
    while not link.sent:
        await asyncio.sleep(0)
    await link.cancel(jobs[2])  # during the pause
    late = await link.submit(request=completion("late"))
    link.go.set()
    await resubmitting
    # the jobs that were at the lost worker go one at a time: the next once the first delivers
    link._on_message(Delta(jobs[0].job_id, "x", 1))
    while len(link.sent) < 4:
        await asyncio.sleep(0)
    sent = [(type(m).__name__, m.id) for m in link.sent]
    assert sent == [("Submit", jobs[0].job_id), ("Cancel", jobs[2].job_id), ("Submit", late.job_id), ("Submit", jobs[1].job_id)]
    assert all(isinstance(m, (Submit, Cancel)) for m in link.sent)


async def test_a_cancel_that_lands_as_the_worker_connects_is_not_lost() -> None:
    """A client that disconnects right after its body cancels its request while the request
    waits for the worker. Python 3.11's wait_for returned the wait's result when the cancel
    landed as the wait completed: the request went on, its job ran to the end and held the
    key's concurrency slot (a 429 for that key's next request)."""
    link = transport()
    link.start = lambda: None  # type: ignore[method-assign]  # nothing connects but this test
    waiting = asyncio.create_task(link.wait_connected(10))
    await asyncio.sleep(0)  # the task now waits for the connection
    link._connected.set()
    waiting.cancel()  # in the same turn of the loop as the connection
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_serves_drain_ends_at_once_the_jobs_held_for_a_worker_that_will_not_be_restarted() -> None:
    """SIGTERM while the worker that crashed is in its restart backoff: the supervisor starts no
    other, and the jobs the link held for its return waited for the whole --drain-timeout (then
    were cut) although nothing could ever run them. They end at once with ``shutdown``; serve's
    drain is then done."""
    from scheduler.management.commands.serve import Drain

    link = transport(lambda: CrashingSim(crash_after=8), restart_delay_s=3600)  # the backoff
    handle = await link.submit(request=completion(max_tokens=200))
    await asyncio.wait_for(link.wait_connected(10), 10)
    while link.connected:  # it crashes running the job
        await asyncio.sleep(0.01)
    assert list(link.inflight) == [handle.job_id] and link.restarts == 1  # held for its return

    class Supervisor:  # serve's WorkerSupervisor in its backoff: drain() stops the restart
        exited = threading.Event()

        def drain(self) -> None:
            self.exited.set()

    drain = Drain(Supervisor(), lambda: [link], drain_timeout_s=3600.0)  # type: ignore[arg-type]
    drain.begin()
    assert drain.step() == "wait"  # its response is still open
    _text, ended = await outcome(handle, timeout_s=10)
    assert isinstance(ended, Error) and ended.reason == SHUTDOWN
    link.finish(handle)
    assert drain.step() == "done"
    await link.stop()
