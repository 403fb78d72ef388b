"""The local socket transport's reader: what the worker writes, however the bytes are cut into
reads, reaches each job as the same messages in the same order."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import AsyncIterator

import pytest

from scheduler.link import client
from scheduler.link import messages as m
from scheduler.link.client import SocketTransport, WorkerSockets


def _fake_worker(sock: socket.socket, cuts: list[int], lines_after: list[bytes], got: list[bytes]) -> None:
    """Say hello, read one Submit, then send its job's messages cut at ``cuts`` (byte counts)."""
    sock.sendall(m.encode(m.Hello(model="m", engine="sim", n_lanes=1, lane_ctx=64, pid=1)))
    buf = b""
    while b"\n" not in buf:
        buf += sock.recv(65536)
    job = json.loads(buf.split(b"\n", 1)[0])["id"]
    got.append(job.encode())
    data = b"".join(line.replace(b"JOB", job.encode()) for line in lines_after)
    at = 0
    for n in [*cuts, len(data)]:
        if at < len(data):
            sock.sendall(data[at : at + n])
        at += n


def _job_lines(n: int) -> list[bytes]:
    out = [m.encode(m.Accepted("JOB", prompt_tokens=3))]
    out += [m.encode(m.Delta("JOB", f"tok{i} é\n", i + 1)) for i in range(n)]
    out.append(b"not json\n")  # a malformed line is dropped, never the connection
    out.append(m.encode(m.Done("JOB", "length", usage={"completion_tokens": n})))
    return out


@contextlib.asynccontextmanager
async def _linked(lines_after: list[bytes], cuts: list[int] | None = None) -> AsyncIterator[SocketTransport]:
    """A socket transport to a fake worker that answers one Submit with ``lines_after`` (cut into
    reads at ``cuts``); yields the transport, connected."""
    ours, theirs = socket.socketpair()
    sockets = WorkerSockets()
    sockets.put(ours)
    transport = SocketTransport(sockets=sockets)
    worker = threading.Thread(target=_fake_worker, args=(theirs, cuts or [], lines_after, []), daemon=True)
    worker.start()
    try:
        assert await transport.wait_connected(10)
        yield transport
    finally:
        await transport.stop()
        theirs.close()
        worker.join(5)


@pytest.mark.parametrize("cuts", [[], [1] * 40, [7, 3, 200, 1, 1, 50], [10_000]], ids=["whole", "bytes", "mixed", "one"])
async def test_every_message_arrives_in_order_however_the_reads_cut_the_lines(cuts: list[int]) -> None:
    ours, theirs = socket.socketpair()
    sockets = WorkerSockets()
    sockets.put(ours)
    transport = SocketTransport(sockets=sockets)
    got: list[bytes] = []
    worker = threading.Thread(target=_fake_worker, args=(theirs, cuts, _job_lines(12), got), daemon=True)
    worker.start()
    try:
        assert await transport.wait_connected(10)
        handle = await transport.submit(request={"endpoint": "completions"})
        events: list[m.JobEvent] = []
        async with asyncio.timeout(10):
            while not events or not isinstance(events[-1], m.Done):
                events.extend(await handle.next_events())
        assert isinstance(events[0], m.Accepted) and events[0].prompt_tokens == 3
        deltas = [e for e in events if isinstance(e, m.Delta)]
        assert [(d.text, d.tokens) for d in deltas] == [(f"tok{i} é\n", i + 1) for i in range(12)]
        assert len(events) == 14 and handle.delivered_text == "".join(d.text for d in deltas)
    finally:
        await transport.stop()
        theirs.close()
        worker.join(5)


async def test_a_line_longer_than_the_bound_ends_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a reader bounded by MAX_LINE_BYTES: the jobs on it are kept for the next worker."""
    monkeypatch.setattr(client, "MAX_LINE_BYTES", 300)
    async with _linked([m.encode(m.Delta("JOB", "x" * 400, 1))], cuts=[100, 100]) as transport:
        handle = await transport.submit(request={"endpoint": "completions"})
        async with asyncio.timeout(10):
            while transport.connected:
                await asyncio.sleep(0.01)
        assert handle.events.empty() and handle.job_id in transport.inflight  # to be submitted again


@pytest.mark.parametrize(
    "bad",
    [b"[" * 100_000 + b"]" * 100_000 + b"\n", b'{"type": "delta", "id": ["JOB"], "text": "x"}\n', b'{"type": "delta", "id": "JOB", "text": 5}\n'],
    ids=["deeply-nested", "id-not-a-string", "text-not-a-string"],
)
async def test_a_malformed_line_from_a_broken_worker_is_dropped_and_the_link_lives_on(bad: bytes) -> None:
    """A line that is JSON of the wrong shape (or too deep to parse) is dropped like any other
    malformed line: the reader goes on and the job still ends."""
    lines = [m.encode(m.Accepted("JOB", prompt_tokens=3)), bad, m.encode(m.Delta("JOB", "ok", 1)), m.encode(m.Done("JOB", "length"))]
    async with _linked(lines) as transport:
        handle = await transport.submit(request={"endpoint": "completions"})
        events: list[m.JobEvent] = []
        async with asyncio.timeout(10):
            while not events or not isinstance(events[-1], m.Done):
                events.extend(await handle.next_events())
        assert handle.delivered_text == "ok" and transport.connected


async def test_a_done_that_cannot_be_applied_ends_its_job_with_an_error() -> None:
    """A Done whose timing is not an object, for a job resumed after a lost worker (its
    preemptions are added to the timing), fails that job: it had already left ``inflight``."""
    async with _linked([b'{"type": "done", "id": "JOB", "finish_reason": "stop", "timing": 5}\n']) as transport:
        handle = await transport.submit(request={"endpoint": "completions"})
        handle.preemptions_lost = 1
        async with asyncio.timeout(10):
            event = await handle.next_event()
        assert isinstance(event, m.Error) and event.reason == m.ENGINE_ERROR and handle.job_id not in transport.inflight
