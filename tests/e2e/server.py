"""The real-server harness (testkit/harness.py, shared with the benchmarks); helpers the e2e tests share."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai

from testkit.harness import RunningServer, free_port

__all__ = [
    "RunningServer",
    "admin_session",
    "assert_a_disconnect_frees_the_lane",
    "assert_streams_batched",
    "free_port",
    "close_openai_clients",
    "lane_count",
    "openai_chat",
    "openai_client",
    "peak_lanes",
    "serving",
    "stream_line",
    "stream_text",
]


_open_clients: list[openai.OpenAI] = []


def openai_client(base: str, api_key: str = "unused", timeout_s: float = 600) -> openai.OpenAI:
    """An ``openai`` client on ``base``'s /v1 (no retries), closed when the test ends
    (tests/conftest.py calls close_openai_clients after every test)."""
    c = openai.OpenAI(base_url=base + "/v1", api_key=api_key, max_retries=0, timeout=timeout_s)
    _open_clients.append(c)
    return c


def close_openai_clients() -> None:
    while _open_clients:
        _open_clients.pop().close()


@contextlib.contextmanager
def serving(*flags: str, env: dict[str, str] | None = None, timeout_s: float = 120.0) -> Iterator[RunningServer]:
    """A real server started with ``flags``, stopped when the block (or the fixture) ends."""
    srv = RunningServer(*flags, env=env).start(timeout_s)
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


@contextlib.contextmanager
def peak_lanes(srv: RunningServer, interval_s: float) -> Iterator[dict[str, int]]:
    """``["lanes"]``: the most lanes the server showed busy at once while the block ran."""
    peak = {"lanes": 0}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak["lanes"] = max(peak["lanes"], srv.state().get("lanes_active", 0))
            time.sleep(interval_s)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield peak
    finally:
        done.set()
        watcher.join()


def assert_streams_batched(srv: RunningServer, n: int, chat: Callable[[int], tuple[str, str]], interval_s: float, idle_s: float) -> None:
    """``n`` chats at once (``chat(i)`` gives one's text and finish reason) all hold a lane
    together and all end normally; within ``idle_s`` every lane is free again."""
    with peak_lanes(srv, interval_s) as peak, ThreadPoolExecutor(n) as pool:
        results = list(pool.map(chat, range(n)))
    assert peak["lanes"] == n
    assert all(text and finish in ("stop", "length") for text, finish in results)
    srv.wait_for(lambda: srv.state()["lanes_active"] == 0, timeout_s=idle_s)


def lane_count(srv: RunningServer) -> int:
    """How many lanes the server's model has (one /slots entry each)."""
    return len(httpx.get(srv.base + "/slots", timeout=10).json())


def assert_a_disconnect_frees_the_lane(srv: RunningServer, model: str, max_tokens: int, lines_before_closing: int, timeout_s: float) -> None:
    """A long streamed chat holds one lane; the client closes its connection after
    ``lines_before_closing`` SSE lines; the job is cancelled and its lane freed (within
    ``timeout_s``, a failsafe, not a measure: how fast belongs to bench/), long before its
    ``max_tokens`` could have been generated."""
    assert srv.state()["lanes_active"] == 0
    body = {"model": model, "messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", srv.base + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        lines = (line for line in r.iter_lines() if line.startswith("data: "))
        for _ in range(lines_before_closing):
            next(lines)
        assert srv.state()["lanes_active"] == 1
    srv.wait_for(lambda: srv.state()["lanes_active"] == 0, timeout_s=timeout_s)


def openai_chat(base: str, model: str, messages: list[dict], max_tokens: int, timeout_s: float = 600) -> tuple[str, str]:
    """(text, finish_reason) of a greedy chat streamed through the ``openai`` client."""
    c = openai_client(base, timeout_s=timeout_s)
    parts, finish = [], ""
    for chunk in c.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True):  # type: ignore[arg-type]
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    return "".join(parts), finish


def stream_text(base: str, body: dict, headers: dict | None = None, on_chunk=None, timeout_s: float = 180) -> tuple[str, dict]:  # type: ignore[no-untyped-def]
    """(text, final usage) of a streamed completion or chat whose path is ``body["_path"]``;
    ``on_chunk(n)`` after each delta. No error frame may arrive."""
    parts: list[str] = []
    usage: dict = {}
    with httpx.stream("POST", base + body.pop("_path"), json=body, headers=headers or {}, timeout=timeout_s) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            pieces, usage = stream_line(line, usage)
            for piece in pieces:
                parts.append(piece)
                if on_chunk is not None:
                    on_chunk(len(parts))
    return "".join(parts), usage


def stream_line(line: str | bytes, usage: dict) -> tuple[list[str], dict]:
    """The text pieces one line of a completion or chat stream carries, and the usage so far
    (``usage``, or the line's own); none from a line that is not a ``data:`` event. No error
    frame may arrive."""
    if not (line.startswith("data: {") if isinstance(line, str) else line.startswith(b"data: {")):
        return [], usage
    event = json.loads(line[6:])
    assert "error" not in event, event
    pieces = [choice.get("text") or (choice.get("delta") or {}).get("content") or "" for choice in event.get("choices", [])]
    return [p for p in pieces if p], event.get("usage") or usage
