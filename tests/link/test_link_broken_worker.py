"""The local socket link against a broken worker: a line whose values no worker would send (a
number too big for an int, from a worker with a bug or of another version) fails the job it names
at most, never the link's reader, which every other job on the link depends on."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

from scheduler.link import messages as m
from scheduler.link.client import JobHandle, SocketTransport, WorkerSockets


def _worker(sock: socket.socket, replies: list[bytes], got: list[bytes] | None = None) -> None:
    """Say hello; answer the n-th Submit with ``replies[n]`` (``JOB``: its id); each Submit read
    is added to ``got``."""
    sock.sendall(m.encode(m.Hello(model="m", engine="sim", n_lanes=1, lane_ctx=64, pid=threading.get_ident())))
    reader = sock.makefile("rb")
    for reply in replies:
        while True:
            line = reader.readline()
            if not line:
                return
            body = json.loads(line)
            if body["type"] == "submit":
                if got is not None:
                    got.append(line)
                break
        sock.sendall(reply.replace(b"JOB", body["id"].encode()))


async def _ending(handle: JobHandle) -> m.JobEvent:
    async with asyncio.timeout(10):
        while True:
            event = await handle.next_event()
            if isinstance(event, (m.Done, m.Error, m.Rejected)):
                return event


async def _failed_alone(transport: SocketTransport, handle: JobHandle) -> None:
    """``handle`` ended with engine_error and left the link's jobs; the next job is served."""
    event = await _ending(handle)
    assert isinstance(event, m.Error) and event.reason == m.ENGINE_ERROR
    assert handle.job_id not in transport.inflight
    other = await transport.submit(request={"endpoint": "completions"})
    assert isinstance(await _ending(other), m.Done)


async def test_a_done_with_an_infinite_preemption_count_fails_its_job_and_the_link_lives_on() -> None:
    """A resumed job's Done adds the lost worker's preemptions to its timing: ``1e999`` (JSON
    for infinity) made that sum raise OverflowError, which ended the reader. The link still said
    connected, so this job and every job after it waited for ever."""
    ours, theirs = socket.socketpair()
    sockets = WorkerSockets()
    sockets.put(ours)
    transport = SocketTransport(sockets=sockets)
    bad = b'{"type":"done","id":"JOB","finish_reason":"stop","timing":{"preemptions":1e999}}\n'
    good = m.encode(m.Accepted("JOB", prompt_tokens=1)) + m.encode(m.Done("JOB", "stop"))
    worker = threading.Thread(target=_worker, args=(theirs, [bad, good]), daemon=True)
    worker.start()
    try:
        assert await transport.wait_connected(10)
        first = await transport.submit(request={"endpoint": "completions"})
        first.preemptions_lost = 1  # it ran on a worker lost before
        await _failed_alone(transport, first)
    finally:
        await transport.stop()
        theirs.close()
        worker.join(5)


async def test_a_delta_with_a_preemption_count_that_is_no_number_ends_its_job_not_the_link() -> None:
    """The count a Delta carries is added up when its job is submitted again after a lost worker:
    a string there raised TypeError as the next worker said hello, which ended the reader for
    good (the link still said connected, so that job and every job after it waited for ever).
    The job ends with an error, as on the Redis link, and the next worker serves the others."""
    sockets = WorkerSockets()
    transport = SocketTransport(sockets=sockets)
    ours, theirs = socket.socketpair()
    sockets.put(ours)
    bad = b'{"type":"delta","id":"JOB","text":"a","tokens":1,"preemptions":"x"}\n'
    first = threading.Thread(target=_worker, args=(theirs, [bad]), daemon=True)
    first.start()
    second_theirs: socket.socket | None = None
    try:
        assert await transport.wait_connected(10)
        handle = await transport.submit(request={"endpoint": "completions"})
        async with asyncio.timeout(10):
            assert isinstance(await handle.next_event(), m.Delta)
        first.join(5)
        theirs.close()  # the worker dies
        async with asyncio.timeout(10):
            while transport.connected:
                await asyncio.sleep(0.01)
        ours2, second_theirs = socket.socketpair()
        done = m.encode(m.Accepted("JOB", prompt_tokens=1)) + m.encode(m.Done("JOB", "stop"))
        second = threading.Thread(target=_worker, args=(second_theirs, [done]), daemon=True)
        second.start()
        sockets.put(ours2)
        await _failed_alone(transport, handle)
    finally:
        await transport.stop()
        theirs.close()
        if second_theirs is not None:
            second_theirs.close()
