"""The transport seam: what the web side needs from "the engine worker", whatever carries it.

A :class:`Transport` submits jobs, cancels them, configures the worker, yields each job's events
and keeps the latest snapshot. Three implementations share this interface:

- :class:`scheduler.link.inprocess.InProcessTransport`: the worker loop on a thread of this
  process (the simulated engine in fast tests);
- :class:`scheduler.link.client.SocketTransport`: one worker process over a private local socket
  (an inherited ``socketpair``; ``manage.py serve``);
- a Redis transport (scale-out, later): jobs wait in Redis, events come back on a stream per job.

Everything about jobs that does not depend on the carrier lives here, once: a job is encoded
before it is registered (a job that cannot be encoded fails alone, with ``unencodable``); jobs in
flight when the worker goes away are submitted again, continuing after the text already delivered;
those that were at the lost worker go back one at a time (the next once the one before has
delivered text or ended), so a job that was in flight during two worker losses in a row, which
fails with ``engine_crashed`` instead of being tried a third time, is the one that crashed it and
not every job that happened to be beside it; when draining, a lost worker fails its jobs with
``shutdown``.

A subclass provides :meth:`_send` (put one encoded message on the carrier) and calls
:meth:`_on_hello`, :meth:`_on_message` and :meth:`_on_lost` as the carrier reports them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scheduler.aio import keeping_cancel, spawn

from .messages import (
    ENGINE_CRASHED,
    ENGINE_ERROR,
    ENGINE_UNAVAILABLE,
    SHUTDOWN,
    SHUTTING_DOWN,
    UNENCODABLE,
    Accepted,
    Cancel,
    Config,
    Delta,
    Done,
    EncodeError,
    Error,
    Hello,
    JobEvent,
    Message,
    Rejected,
    Snapshot,
    Submit,
    encode,
)

log = logging.getLogger("superfluid.link")

# Called with every worker snapshot, on the event loop. Apps register here (the dashboard's feed
# does in its AppConfig.ready) so the link knows nothing about who listens.
SNAPSHOT_LISTENERS: list[Callable[[dict[str, Any]], None]] = []

# A job in flight during this many worker losses in a row is failed, not submitted again: a
# prompt that crashes the engine would otherwise crash every new worker.
MAX_CRASHES = 2


@dataclass(eq=False)
class JobHandle:
    """A submitted job as the web side sees it: its events arrive on ``events``."""

    job_id: str
    submit: Submit
    events: asyncio.Queue[JobEvent] = field(default_factory=asyncio.Queue)
    accepted: bool = False
    prompt_tokens: int | None = None  # as its worker accepted it (the first Accepted's)
    delivered_text: str = ""
    delivered_tokens: int = 0
    key: str | None = None  # the API key's name, for /slots and the dashboard; never sent
    crashes: int = 0  # worker losses in a row while this job was at the worker
    sent_on: int = -1  # the connection it was last sent on (-1: not sent yet)
    request: str = ""  # the client request it serves, when several jobs do (n > 1, several prompts); never sent
    preemptions: int = 0  # by the worker it is at, as that worker's last Delta said
    preemptions_lost: int = 0  # by the workers lost before (a job submitted again): its Done adds them
    # Redis mode: another head took the job over (its client resumed the stream there with
    # Last-Event-ID): its response and its activity row are that head's
    handed_over: bool = False

    async def next_event(self) -> JobEvent:
        return await self.events.get()

    async def next_events(self) -> list[JobEvent]:
        """The next event and every one queued behind it (a tick's worth when the reader fell
        behind), so that a stream writes what arrived together in one send."""
        ready = [await self.events.get()]
        while not self.events.empty():
            ready.append(self.events.get_nowait())
        return ready

    def resubmission(self) -> Submit:
        """The job again, for the next worker, after the text already delivered; the lost
        worker's preemptions are kept for the Done (each worker counts only its own)."""
        self.preemptions_lost += self.preemptions
        self.preemptions = 0
        return dataclasses.replace(self.submit, resume_text=self.delivered_text, resume_tokens=self.delivered_tokens)


class Transport(ABC):
    """The web side's link to the engine worker. One per event loop (see ``get_link``)."""

    # the jobs submitted wait for a lane at the worker itself, which finishes all it was given
    # when it drains; False: they wait in a queue shared by workers (Redis), which a draining
    # worker stops pulling from, so serve's drain tells it only once they have ended (Drain)
    queue_at_worker = True

    def __init__(self, *, reconnect_timeout_s: float = 120.0) -> None:
        self.reconnect_timeout_s = reconnect_timeout_s
        self.inflight: dict[str, JobHandle] = {}  # submitted and not yet done at the worker
        self.open: set[str] = set()  # submitted and not yet finished by the web side (response sent)
        self.hello: Hello | None = None
        self.snapshot: dict[str, Any] | None = None
        self.snapshot_at: float | None = None  # when it came (time.monotonic())
        self.draining = False
        self.worker_restarts = 0
        self.worker_config: Config | None = None  # the last one, sent again on reconnect
        self._connected = asyncio.Event()
        self._lost_since: float | None = None
        self._connection = 0  # counts connections, so a job knows which worker it was sent to
        self._abandoning: set[asyncio.Task[None]] = set()
        # After a loss, the jobs that were at the lost worker ("suspects": crashes > 0) go to the
        # next one one at a time: ``_trial`` is the one sent, the next goes once it has delivered
        # text or ended. Sent together, a job beside a prompt that crashes the engine crashed
        # with it twice and failed with engine_crashed too.
        self._trial: str | None = None
        self._trials: set[asyncio.Task[None]] = set()

    # -- lifecycle (the carrier) --------------------------------------------------------

    @abstractmethod
    def start(self) -> None:
        """Begin connecting (idempotent); runs on the event loop."""

    @abstractmethod
    async def stop(self) -> None:
        """Close the carrier."""

    @abstractmethod
    async def _send(self, data: bytes) -> None:
        """Put one encoded message on the carrier. A lost carrier is reported through _on_lost,
        not raised here."""

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def wait_connected(self, timeout_s: float) -> bool:
        self.start()
        if self._connected.is_set():
            return True
        # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancel that lands as
        # the wait completes, and a client's disconnect right after its body was then lost (its
        # job ran to the end, holding its key's concurrency slot)
        try:
            async with asyncio.timeout(timeout_s):
                await self._connected.wait()
        except TimeoutError:
            return False
        return True

    # -- requests ----------------------------------------------------------------------

    async def submit(self, **fields: Any) -> JobHandle:
        """Submit a job (the fields of :class:`Submit` but ``id``). The message is encoded before
        the job is registered: one that cannot be encoded is never registered and its handle's
        only event is ``Rejected(unencodable)``."""
        message = Submit(id=uuid.uuid4().hex, **fields)
        handle = JobHandle(job_id=message.id, submit=message)
        if self.draining:
            # checked here, as the job is registered, and not only by the caller before its
            # awaits: serve's drain tells a Redis fleet's worker once no registered job is left,
            # and a job registered after that would wait in the queue for its deadline
            handle.events.put_nowait(Rejected(message.id, SHUTTING_DOWN, "The server is shutting down."))
            return handle
        try:
            data = encode(message)
        except EncodeError as exc:
            handle.events.put_nowait(Rejected(message.id, UNENCODABLE, str(exc)))
            return handle
        self.inflight[handle.job_id] = handle
        self.open.add(handle.job_id)
        self.start()
        if self.connected:  # otherwise it is sent when the worker (re)connects
            handle.sent_on = self._connection
            try:
                await keeping_cancel(self._send(data))
            except BaseException:
                # cancelled (the client went away) while sending: no caller will ever hold this
                # handle to cancel or finish it, and the submit may have gone out
                Transport.finish(self, handle)  # the bookkeeping only: no response was begun
                self._abandon(handle.job_id)
                raise
        return handle

    def _abandon(self, job_id: str) -> asyncio.Task[None]:
        """Cancel at the worker a job whose submit may have been sent, from a task of its own
        (the caller is being cancelled)."""
        return spawn(self._abandoning, self._send(encode(Cancel(job_id))))

    async def _send_cancel(self, job_id: str) -> None:
        """Send a job's Cancel and wait for it, from a task of its own: a consumer sends it from
        its clean-up, and a second cancel there (daphne cancels an application still running past
        its close timeout) then ends the wait, not the send. Cut off before it went out, the
        job ran on to its last token for nobody."""
        await asyncio.shield(self._abandon(job_id))

    async def cancel(self, handle: JobHandle) -> None:
        self.open.discard(handle.job_id)
        if self.inflight.pop(handle.job_id, None) is not None:
            self._cleared(handle.job_id)
            if self.connected:
                await self._send_cancel(handle.job_id)

    def requests_in_flight(self) -> int:
        """Client requests with a job at the worker: the jobs of one request (its choices, its
        prompts) count once."""
        return len({handle.request or job_id for job_id, handle in self.inflight.items()})

    def finish(self, handle: JobHandle) -> None:
        """The response for this job has been sent (or abandoned)."""
        if self.inflight.pop(handle.job_id, None) is not None:
            self._cleared(handle.job_id)
        self.open.discard(handle.job_id)

    async def configure_models(self, configs: dict[str, Config]) -> None:
        """Each served model's worker settings (model id -> Config): a link to one worker sends
        its own model's, or the first when the worker has not said its model yet."""
        model = self.hello.model if self.hello is not None else ""
        await self.configure(configs.get(model) or next(iter(configs.values())))

    async def configure(self, config: Config) -> None:
        """Worker settings the admin can change: sent now if connected, and again after every
        (re)connect, before any job is submitted again."""
        data = encode(config)
        self.worker_config = config
        self.start()
        if self.connected:
            await self._send(data)

    def fail_all(self, reason: str, detail: str) -> None:
        """End every job still at the worker with ``Error(reason)`` (a drain that ran out of time)."""
        for handle in list(self.inflight.values()):
            self._fail(handle, reason, detail)

    def _fail(self, handle: JobHandle, reason: str, detail: str) -> None:
        if self.inflight.pop(handle.job_id, None) is not None:
            self._cleared(handle.job_id)
        handle.events.put_nowait(Error(handle.job_id, reason, detail))

    # -- what the carrier reports ---------------------------------------------------------

    # whether a hello from another pid than the last counts as a restart (a fleet's head counts
    # new worker processes itself: its hello is the first of several workers)
    _hello_counts_restarts = True

    async def _greet(self, hello: Hello) -> None:
        """Note the worker that answered (a new pid counts a restart) and send it the config."""
        if self._hello_counts_restarts and self.hello is not None and hello.pid != self.hello.pid:
            self.worker_restarts += 1
        self.hello = hello
        self._connection += 1
        self._lost_since = None
        self._connected.set()
        if self.worker_config is not None:
            await self._send(encode(self.worker_config))

    async def _on_hello(self, hello: Hello) -> None:
        """A worker is there: send the config, then every job in flight again (those that were
        at a lost worker one at a time: ``_next_trial``)."""
        await self._greet(hello)
        connection = self._connection
        self._trial = None
        for handle in list(self.inflight.values()):
            # each send may pause (a full socket): a job cancelled meanwhile is not sent again, and
            # one submitted since the greeting was sent by its submit
            if self.inflight.get(handle.job_id) is not handle or handle.sent_on == connection or handle.crashes:
                continue
            await self._resend(handle)
        await self._next_trial()

    def _resubmission(self, handle: JobHandle) -> tuple[Submit, bytes] | None:
        """The job's Submit for the next worker, and its encoding; None where it cannot be sent
        again, the job failed. What a broken worker's Delta left (a preemption count that is no
        number) raised here: on the socket link it ended the reader as the next worker said
        hello (every job waited for ever), on the Redis link it was retried for ever."""
        try:
            message = handle.resubmission()
            return message, encode(message)
        except EncodeError as exc:
            self._fail(handle, UNENCODABLE, str(exc))
        except (TypeError, ValueError) as exc:
            log.warning("job %s cannot be submitted again after a malformed message from its worker: %r", handle.job_id, exc)
            self._fail(handle, ENGINE_ERROR, "The engine worker's reply could not be read.")
        return None

    async def _resend(self, handle: JobHandle) -> None:
        again = self._resubmission(handle)
        if again is None:
            return
        handle.sent_on = self._connection
        await self._send(again[1])

    async def _next_trial(self) -> None:
        """Send the next job that was at a lost worker (the best class first), unless one such
        job is at this worker and has delivered no text since (``_trial``): then it goes once
        that one has, or has ended."""
        while self.connected and self._trial is None:
            connection = self._connection
            # the best class first (a chat before the agents beside it), then in submission order
            suspects = (h for h in self.inflight.values() if h.crashes and h.sent_on != connection)
            handle = min(suspects, key=lambda h: h.submit.qos, default=None)
            if handle is None:
                return
            self._trial = handle.job_id
            await self._resend(handle)  # a job that cannot be encoded fails, and clears its trial

    def _cleared(self, job_id: str) -> None:
        """The job on trial delivered text or left: the next one that was at a lost worker goes."""
        if job_id == self._trial:
            self._trial = None
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # not on the loop: the next hello sends it
                return
            if self.connected:
                spawn(self._trials, self._next_trial())

    def _on_lost(self, now: float) -> None:
        """The worker went away. Jobs it had are submitted again when one comes back, except a
        job it had during the previous loss too (``engine_crashed``), or all when draining."""
        lost = self._connection
        was_connected = self.connected
        self._connected.clear()
        if not was_connected:
            return
        self._lost_since = now
        self._trial = None
        if self.draining:
            self.fail_all(SHUTDOWN, "The server shut down before this request finished.")
            return
        for handle in list(self.inflight.values()):
            if handle.sent_on != lost:
                continue
            handle.crashes += 1
            if handle.crashes >= MAX_CRASHES:
                log.error("job %s was in flight during %d worker losses in a row; failing it", handle.job_id, handle.crashes)
                self._fail(handle, ENGINE_CRASHED, "The engine worker crashed twice while running this request; it is not retried.")
        log.warning("engine worker went away with %d jobs in flight; waiting for it", len(self.inflight))

    def _check_lost_deadline(self, now: float) -> None:
        if self._lost_since is None or now - self._lost_since < self.reconnect_timeout_s:
            return
        self.fail_all(ENGINE_UNAVAILABLE, "The engine worker is unavailable.")

    def _apply_from_worker(self, message: Message, handle: JobHandle | None) -> None:
        """``_on_message`` for a message a worker sent. A field of the wrong type (an id that is
        a list, a text that is a number, a count of 1e999: a broken worker's) drops that message,
        never the reader every job on the link depends on; a terminal message for ``handle`` that
        it cut short (the job had left ``inflight``) ends that job."""
        try:
            self._on_message(message)
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            log.warning("dropping a malformed %s message from a worker: %r", message.type, exc)
            ended = isinstance(message, (Done, Error, Rejected)) and handle is not None and message.id == handle.job_id
            if ended and handle.job_id not in self.inflight:
                self._fail(handle, ENGINE_ERROR, "The engine worker's reply could not be read.")

    def _on_message(self, message: Message) -> None:
        if isinstance(message, Snapshot):
            self.snapshot = message.state
            self.snapshot_at = time.monotonic()
            for listener in SNAPSHOT_LISTENERS:
                listener(self.snapshot)
            return
        handle = self.inflight.get(getattr(message, "id", ""))
        if handle is None:
            return
        if isinstance(message, Accepted):
            if handle.accepted:
                return  # a resubmission after a worker restart
            handle.accepted = True
            handle.prompt_tokens = message.prompt_tokens
        elif isinstance(message, Delta):
            if not message.text and not message.logprobs:  # a job parked (a preemption): nothing to relay
                handle.preemptions = message.preemptions
                return
            handle.delivered_text += message.text
            handle.delivered_tokens = message.tokens
            handle.preemptions = message.preemptions
            handle.crashes = 0  # progress since the last loss: a loss now is not "in a row"
            self._cleared(handle.job_id)
        elif isinstance(message, (Done, Error, Rejected)):
            self.inflight.pop(handle.job_id, None)
            self._cleared(handle.job_id)
            if isinstance(message, Error) and message.reason == UNENCODABLE and self.connected:
                # the worker could not put this job's output on the link (a NaN logprob) and says
                # so in its place, but runs the job on: stop it, or it holds its lane to the end
                self._abandon(handle.job_id)
            if isinstance(message, Done) and handle.preemptions_lost and "preemptions" in message.timing:
                timing = {**message.timing, "preemptions": int(message.timing["preemptions"] or 0) + handle.preemptions_lost}
                message = dataclasses.replace(message, timing=timing)
        else:
            return
        handle.events.put_nowait(message)  # type: ignore[arg-type]


async def cancel_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background task (a link's reader, the key watcher) and wait until it has ended."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

