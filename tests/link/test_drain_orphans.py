"""serve's drain (``Drain``) and the jobs a local link holds while no worker is connected (the
first one still loading the model, or a crashed one's replacement still loading): the worker that
connects next has been told to drain before it reads them, so none of them can ever run."""

from __future__ import annotations

import asyncio
import threading

from scheduler.link.messages import SHUTDOWN, Error

from .conftest import completion, outcome, transport


class LoadingSupervisor:
    """serve's WorkerSupervisor while its worker loads the model: the SIGTERM waits, blocked,
    until the load has ended (runengine takes it only then), so the worker has not exited."""

    def __init__(self) -> None:
        self.exited = threading.Event()
        self.told = False

    def drain(self) -> None:
        self.told = True


async def test_the_jobs_waiting_for_a_worker_still_loading_end_at_once_when_the_drain_tells_it() -> None:
    """They waited for the whole load (minutes for a large model) or the drain's deadline, and
    then ended with the same 503 anyway: the worker, told to drain first, refuses every job it
    reads after that. Like the jobs held for a worker in its restart backoff, they end at once."""
    from scheduler.management.commands.serve import Drain

    link = transport()
    link.start = lambda: None  # type: ignore[method-assign]  # the worker is still loading: nothing connects
    handle = await link.submit(request=completion(max_tokens=20))
    assert list(link.inflight) == [handle.job_id] and not link.connected
    supervisor = LoadingSupervisor()
    drain = Drain(supervisor, lambda: [link], drain_timeout_s=3600.0)  # type: ignore[arg-type]
    drain.begin()
    assert supervisor.told
    assert drain.step() == "wait"  # the worker has not exited yet
    _text, ended = await outcome(handle, timeout_s=2)
    assert isinstance(ended, Error) and ended.reason == SHUTDOWN
    link.finish(handle)
    supervisor.exited.set()
    assert drain.step() == "done"


async def test_a_job_of_a_connected_worker_is_left_to_it() -> None:
    """A worker that is connected got the job and finishes it (its own drain-timeout)."""
    from scheduler.management.commands.serve import Drain

    link = transport()
    handle = await link.submit(request=completion(max_tokens=5))
    await asyncio.wait_for(link.wait_connected(10), 10)
    supervisor = LoadingSupervisor()
    drain = Drain(supervisor, lambda: [link], drain_timeout_s=3600.0)  # type: ignore[arg-type]
    drain.begin()
    assert drain.step() == "wait"
    text, ended = await outcome(handle, timeout_s=10)
    assert type(ended).__name__ == "Done" and text
    link.finish(handle)
    await link.stop()
