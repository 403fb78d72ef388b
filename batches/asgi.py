"""A bound on the body of ``POST /v1/files`` before Django reads it: Django's ASGI handler would
spool any body, however large, to disk before the view could look at its size. Over the bound
(its ``Content-Length`` at once, or its bytes as they arrive) the request is a 413
``request_too_large`` and the rest of the body is never read."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ENVELOPE_BYTES = 64 * 1024  # the multipart parts around the file: its name, the purpose


def max_file_bytes() -> int:
    """The largest batch file: SUPERFLUID_BATCH_MAX_FILE_BYTES, by default --max-body-bytes.
    (Here, not in views: the protocol layer, api/edge.py, bounds uploads by it too.)"""
    from django.conf import settings

    from superfluid_site.serving import serving

    return int(getattr(settings, "SUPERFLUID_BATCH_MAX_FILE_BYTES", 0) or serving().max_body_bytes)


def upload_limit() -> int:
    return max_file_bytes() + ENVELOPE_BYTES


class BoundedBody:
    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], limit: Callable[[], int] = upload_limit) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit()
        for name, value in scope.get("headers", []):
            if name.lower() == b"content-length":
                try:
                    if int(value) > limit:
                        await self._refuse(send, limit)
                        return
                except ValueError:
                    pass
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._refuse(send, limit)
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(send: Send, limit: int) -> None:
        from api.errors import request_too_large

        exc = request_too_large(limit - ENVELOPE_BYTES)
        await send({"type": "http.response.start", "status": exc.status, "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": json.dumps(exc.body()).encode()})
