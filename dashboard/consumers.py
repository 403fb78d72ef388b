"""The dashboard's websocket: staff only; joins this web process's group (``feed.GROUP``) that ``feed.py`` pushes to."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from .feed import GROUP, full_state, models_view

log = logging.getLogger("superfluid.dashboard")

CLOSE_FORBIDDEN = 4403
GROUP_REFRESH_S = 3600.0
STAFF_RECHECK_S = 5.0  # an open page stops getting pushes this soon after its user logs out or loses staff
# A page whose connection still holds this much unsent gets no push until it drains: every push is
# the whole state, so the next one sent makes up for those skipped. Daphne pings only a socket
# that sent nothing for 20 s, so a client that sends but never reads was never dropped, and the
# pushes it did not read piled up in the server's memory without bound.
MAX_UNSENT_BYTES = 256 * 1024


def is_staff(user: Any) -> bool:
    return bool(user is not None and getattr(user, "is_authenticated", False) and getattr(user, "is_active", False) and getattr(user, "is_staff", False))


def still_staff(session_key: str | None, user_pk: Any) -> bool:
    """Whether the session the page connected with is still this user's, logged in (not logged
    out, expired, or ended by a password change), and the user still active staff."""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.utils.crypto import constant_time_compare

    if not session_key:
        return False
    data = import_module(settings.SESSION_ENGINE).SessionStore(session_key).load()
    if str(data.get(SESSION_KEY)) != str(user_pk):
        return False
    user = get_user_model().objects.filter(pk=user_pk).first()
    if user is None or not is_staff(user):
        return False
    return constant_time_compare(str(data.get(HASH_SESSION_KEY, "")), user.get_session_auth_hash())


class LanesConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        if not is_staff(self.scope.get("user")):
            await self.close(code=CLOSE_FORBIDDEN)  # before accept: the handshake is refused (403)
            return
        await self.channel_layer.group_add(GROUP, self.channel_name)
        self._refresh = asyncio.get_running_loop().create_task(self._keep_membership())
        self._watch = asyncio.get_running_loop().create_task(self._watch_user())
        await self.accept()
        # The first state, so the page need not wait for the next push. Nothing here may raise
        # out of connect: the consumer would end without its disconnect, and its channel would
        # stay in the group (renewed hourly) with its user re-checked every few seconds, for good.
        try:
            from superfluid_site.runtime import get_link

            link = get_link()  # starts the link to the worker if no request has yet
            # with several models and none loaded there is no snapshot (no worker runs): the
            # router's view still tells the page so, and that nothing it shows is old
            if link.snapshot or models_view():
                message: dict[str, Any] = {"type": "state", "state": full_state(link.snapshot or {})}
                if (age_ms := snapshot_age_ms(link)) is not None:
                    message["age_ms"] = age_ms
                await self.send_json(message)
        except Exception:  # the next push brings the state
            log.exception("dashboard: could not send a page its first state")

    async def _keep_membership(self) -> None:
        """Group memberships expire (a day in the in-memory layer); a dashboard may stay open longer."""
        while True:
            await asyncio.sleep(GROUP_REFRESH_S)
            try:
                await self.channel_layer.group_add(GROUP, self.channel_name)
            except Exception:  # Redis away for a moment: the next refresh, well within a day, tries again
                log.warning("dashboard: could not renew a page's group membership", exc_info=True)

    async def _watch_user(self) -> None:
        """The user was checked when the page connected; a logout, a lost staff status or a
        deactivation later closes the page's socket (it was fed on for as long as it stayed open)."""
        from channels.db import database_sync_to_async

        session = self.scope.get("session")
        session_key = getattr(session, "session_key", None)
        user_pk = getattr(self.scope.get("user"), "pk", None)
        while True:
            await asyncio.sleep(STAFF_RECHECK_S)
            try:
                ok = await database_sync_to_async(still_staff)(session_key, user_pk)
            except Exception:  # the database away for a moment: asked again at the next check
                log.warning("dashboard: could not check a page's user", exc_info=True)
                continue
            if not ok:
                await self.channel_layer.group_discard(GROUP, self.channel_name)
                await self.close(code=CLOSE_FORBIDDEN)
                return

    async def disconnect(self, code: int) -> None:
        for task in (getattr(self, "_refresh", None), getattr(self, "_watch", None)):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if self.channel_layer is not None:
            await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        """The page only listens: whatever it sends (not JSON, binary) is ignored. Decoding it
        as JSON raised, killed the consumer before its disconnect, and left its channel in the
        group (renewed hourly) for good."""
        return None

    async def lanes_update(self, event: dict[str, Any]) -> None:
        if backed_up(self.base_send):
            return  # a slow or non-reading page: skipped, the next push after it drains has it all
        await self.send_json({"type": "state", "state": event["state"]})


def unsent_bytes(send: Any) -> int | None:
    """How many bytes the server holds, written to this socket's connection and not yet taken by
    the client: found under daphne (its ``send`` is ``partial(handle_reply, protocol)``, maybe
    behind Channels' session wrapper; the protocol's Twisted transport, maybe behind TLS or
    other wrappers, buffers what the client has not read). None elsewhere (tests, other servers)."""
    for _ in range(8):
        if isinstance(send, functools.partial):
            transport = next((a.transport for a in send.args if hasattr(a, "transport")), None)
            for _ in range(8):
                if transport is None:
                    return None
                if hasattr(transport, "dataBuffer") and hasattr(transport, "_tempDataLen"):  # a Twisted FileDescriptor (TCP)
                    try:
                        return len(transport.dataBuffer) - int(transport.offset) + int(transport._tempDataLen)
                    except (AttributeError, TypeError, ValueError):
                        return None
                transport = getattr(transport, "transport", None)  # a wrapper (TLS): what it writes to
            return None
        send = getattr(getattr(send, "__self__", None), "real_send", None)  # Channels' InstanceSessionWrapper.send
        if send is None:
            return None
    return None


def backed_up(send: Any) -> bool:
    unsent = unsent_bytes(send)
    return unsent is not None and unsent > MAX_UNSENT_BYTES


def snapshot_age_ms(link: Any) -> int | None:
    """How old the link's snapshot is when its worker is away (crashed, restarting): the page
    then shows it as that old at once, not as live until no push came for a while. None while
    the worker is connected, for a Redis fleet's view (always current) or where unknown."""
    snapshot, at = getattr(link, "snapshot", None), getattr(link, "snapshot_at", None)
    if not snapshot or at is None or "fleet" in snapshot or getattr(link, "snapshot_connected", getattr(link, "connected", True)):
        return None
    return max(0, round((time.monotonic() - at) * 1000))
