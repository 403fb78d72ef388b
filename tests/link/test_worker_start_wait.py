"""The socket link while a new worker starts: serve hands the web side the new worker's socket
as it starts the process, before the model is loaded; until it says hello no worker is back, and
jobs still end with ``engine_unavailable`` once ``reconnect_timeout_s`` has passed."""

from __future__ import annotations

import asyncio
import socket

from scheduler.link import messages as m
from scheduler.link.client import SocketTransport, WorkerSockets


async def test_jobs_end_with_engine_unavailable_while_a_new_worker_takes_too_long_to_say_hello() -> None:
    first, first_worker = socket.socketpair()
    second, second_worker = socket.socketpair()  # a worker still loading its model: says nothing
    sockets = WorkerSockets()
    sockets.put(first)
    transport = SocketTransport(sockets=sockets, reconnect_timeout_s=0.3)
    try:
        first_worker.sendall(m.encode(m.Hello(model="m", engine="sim", n_lanes=1, lane_ctx=64, pid=1)))
        assert await transport.wait_connected(10)
        handle = await transport.submit(request={"endpoint": "completions"})
        sockets.put(second)  # serve starts the next worker...
        first_worker.close()  # ... the first one died
        async with asyncio.timeout(5):
            event = await handle.next_event()
        assert isinstance(event, m.Error) and event.reason == m.ENGINE_UNAVAILABLE
        assert not transport.inflight
    finally:
        await transport.stop()
        second_worker.close()
