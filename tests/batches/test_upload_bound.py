"""POST /v1/files: a body over the bound is refused with 413 before Django reads it, by its
Content-Length at once or by its bytes as they arrive; a body within it reaches the app whole."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from batches.asgi import ENVELOPE_BYTES, BoundedBody


def call(chunks: list[bytes], content_length: int | None, limit: int = 100) -> tuple[list[dict[str, Any]], list[bytes], int]:
    """(messages sent back, the body the app saw, how many chunks were read)."""
    reached: list[bytes] = []
    sent: list[dict[str, Any]] = []
    read = 0

    async def app(scope: dict, receive: Any, send: Any) -> None:
        parts = []
        while True:
            m = await receive()
            parts.append(m.get("body", b""))
            if not m.get("more_body"):
                break
        reached.append(b"".join(parts))
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive() -> dict[str, Any]:
        nonlocal read
        read += 1
        return {"type": "http.request", "body": chunks[read - 1], "more_body": read < len(chunks)}

    async def send(m: dict[str, Any]) -> None:
        sent.append(m)

    headers = [(b"content-length", str(content_length).encode())] if content_length is not None else []
    asyncio.run(BoundedBody(app, lambda: limit)({"type": "http", "headers": headers}, receive, send))
    return sent, reached, read


def test_a_declared_length_over_the_bound_is_refused_unread() -> None:
    sent, reached, read = call([b"x" * 50], content_length=101)
    assert sent[0]["status"] == 413 and reached == [] and read == 0
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == "request_too_large" and str(100 - ENVELOPE_BYTES) in error["message"]


def test_a_chunked_body_over_the_bound_is_refused_as_it_arrives() -> None:
    sent, reached, read = call([b"x" * 60, b"x" * 60, b"x" * 60, b"x" * 60], content_length=None)
    assert sent[0]["status"] == 413 and reached == [] and read == 2


def test_a_body_within_the_bound_reaches_the_app_whole() -> None:
    sent, reached, _read = call([b"a" * 40, b"b" * 60], content_length=100)
    assert sent[0]["status"] == 200 and reached == [b"a" * 40 + b"b" * 60]
