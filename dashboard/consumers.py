"""The dashboard's websocket: staff only; joins the group "lanes" that ``feed.py`` pushes to."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from .feed import GROUP, full_state

log = logging.getLogger("superfluid.dashboard")

CLOSE_FORBIDDEN = 4403
GROUP_REFRESH_S = 3600.0


def is_staff(user: Any) -> bool:
    return bool(user is not None and getattr(user, "is_authenticated", False) and getattr(user, "is_active", False) and getattr(user, "is_staff", False))


class LanesConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        if not is_staff(self.scope.get("user")):
            await self.close(code=CLOSE_FORBIDDEN)  # before accept: the handshake is refused (403)
            return
        await self.channel_layer.group_add(GROUP, self.channel_name)
        self._refresh = asyncio.get_running_loop().create_task(self._keep_membership())
        await self.accept()
        from superfluid_site.runtime import get_link

        link = get_link()  # starts the link to the worker if no request has yet
        if link.snapshot:
            await self.send_json({"type": "state", "state": full_state(link.snapshot)})

    async def _keep_membership(self) -> None:
        """Group memberships expire (a day in the in-memory layer); a dashboard may stay open longer."""
        while True:
            await asyncio.sleep(GROUP_REFRESH_S)
            try:
                await self.channel_layer.group_add(GROUP, self.channel_name)
            except Exception:  # Redis away for a moment: the next refresh, well within a day, tries again
                log.warning("dashboard: could not renew a page's group membership", exc_info=True)

    async def disconnect(self, code: int) -> None:
        refresh = getattr(self, "_refresh", None)
        if refresh is not None:
            refresh.cancel()
        if self.channel_layer is not None:
            await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        return None  # the page only listens

    async def lanes_update(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "state", "state": event["state"]})
