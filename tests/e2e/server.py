"""The real-server harness is shared with the benchmarks; helpers the e2e tests share."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import httpx

from bench.harness import RunningServer, free_port

__all__ = ["RunningServer", "admin_session", "free_port", "serving", "stream_text"]


@contextlib.contextmanager
def serving(*flags: str, env: dict[str, str] | None = None) -> Iterator[RunningServer]:
    """A real server started with ``flags``, stopped when the block (or the fixture) ends."""
    srv = RunningServer(*flags, env=env).start()
    try:
        yield srv
    finally:
        srv.stop()


@contextlib.contextmanager
def admin_session(srv: RunningServer, user: str = "root", password: str = "a-long-test-password") -> Iterator[httpx.Client]:
    """A browser's session on the server's admin: a superuser made with ``createsuperuser``,
    logged in through the login form (its CSRF cookie kept for later forms)."""
    srv.manage("createsuperuser", "--noinput", env={"DJANGO_SUPERUSER_USERNAME": user, "DJANGO_SUPERUSER_PASSWORD": password, "DJANGO_SUPERUSER_EMAIL": "root@example.org"})
    with httpx.Client(base_url=srv.base, timeout=30) as session:
        session.get("/admin/login/")
        r = session.post("/admin/login/?next=/admin/", data={"username": user, "password": password, "next": "/admin/", "csrfmiddlewaretoken": session.cookies["csrftoken"]})
        assert r.status_code == 302 and r.headers["location"] == "/admin/", r.text[:2000]
        yield session


def stream_text(base: str, body: dict, headers: dict | None = None, on_chunk=None, timeout_s: float = 180) -> tuple[str, dict]:  # type: ignore[no-untyped-def]
    """(text, final usage) of a streamed completion or chat whose path is ``body["_path"]``;
    ``on_chunk(n)`` after each delta. No error frame may arrive."""
    parts: list[str] = []
    usage: dict = {}
    with httpx.stream("POST", base + body.pop("_path"), json=body, headers=headers or {}, timeout=timeout_s) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                if piece:
                    parts.append(piece)
                    if on_chunk is not None:
                        on_chunk(len(parts))
    return "".join(parts), usage
