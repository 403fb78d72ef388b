"""A dashboard page that never reads what it is sent (while sending often enough that daphne
never pings it) must not make the server hold an ever-growing backlog of pushes for it."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from twisted.internet.abstract import FileDescriptor
from twisted.internet.testing import MemoryReactor

from dashboard import consumers
from dashboard.feed import GROUP

from .test_access import ORIGIN, application, close_dashboard, make_user, session_cookie


class Protocol:
    """Stands for daphne's websocket protocol: what the application sends is written to a real
    Twisted transport whose peer never reads (nothing drains it)."""

    def __init__(self) -> None:
        self.transport = FileDescriptor(reactor=MemoryReactor())
        self.transport.connected = True

    def unsent(self) -> int:
        t = self.transport
        return len(t.dataBuffer) - t.offset + t._tempDataLen


async def handle_reply(send: Any, protocol: Protocol, message: dict[str, Any]) -> None:
    if message["type"] == "websocket.send":
        protocol.transport.write((message.get("text") or "").encode() or message.get("bytes") or b"")
    await send(message)


def daphne_like(app: Any, protocol: Protocol) -> Any:
    async def served(scope: Any, receive: Any, send: Any) -> None:
        await app(scope, receive, functools.partial(handle_reply, send, protocol))

    return served


@pytest.mark.django_db(transaction=True)
async def test_a_page_that_never_reads_gets_no_more_pushes_once_its_backlog_is_full(settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings.SUPERFLUID_SOCKET = str(tmp_path / "no-worker.sock")
    user = await sync_to_async(make_user)("slow", staff=True)
    cookie = await sync_to_async(session_cookie)(user)
    protocol = Protocol()
    comm = WebsocketCommunicator(daphne_like(application(), protocol), "/ws/dashboard/", headers=[ORIGIN, (b"cookie", cookie)])
    connected, _ = await comm.connect()
    assert connected
    try:
        layer = get_channel_layer()
        state = {"model": "m", "lanes": [{"lane": i, "state": "idle", "pad": "x" * 1000} for i in range(50)]}  # ~60 KB a push
        pushes = 40
        for tick in range(pushes):
            await layer.group_send(GROUP, {"type": "lanes.update", "state": {**state, "tick": tick}})
        received = 0
        while not await comm.receive_nothing(timeout=0.3):
            await comm.receive_output()
            received += 1
        one_push = len(protocol.transport._tempDataBuffer[-1])
        assert 0 < received < pushes
        assert protocol.unsent() <= consumers.MAX_UNSENT_BYTES + one_push
        # once the client has read it all, pushes go out again
        protocol.transport._tempDataBuffer.clear()
        protocol.transport._tempDataLen = 0
        await layer.group_send(GROUP, {"type": "lanes.update", "state": {**state, "tick": 99}})
        assert (await comm.receive_json_from(timeout=3))["state"]["tick"] == 99
    finally:
        await close_dashboard(comm)


def test_without_daphne_nothing_is_known_and_nothing_is_skipped() -> None:
    async def send(message: Any) -> None:
        return None

    assert consumers.unsent_bytes(send) is None and not consumers.backed_up(send)
    assert consumers.unsent_bytes(functools.partial(send)) is None
