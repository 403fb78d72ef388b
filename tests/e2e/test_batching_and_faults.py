"""Concurrency, disconnects, worker crashes and graceful shutdown against the real server."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import openai
import pytest

from .server import RunningServer, assert_streams_batched, openai_chat

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"


def stream_chat(base: str, content: str, max_tokens: int) -> tuple[str, str]:
    return openai_chat(base, MODEL, [{"role": "user", "content": content}], max_tokens)


def test_eight_concurrent_streams_are_batched_in_one_worker_and_all_complete(server: RunningServer) -> None:
    assert_streams_batched(server, 8, lambda i: stream_chat(server.base, f"Count to {i + 3}.", 48), interval_s=0.02, idle_s=5)


def test_client_disconnect_cancels_the_job_and_frees_its_lane_within_a_second(server: RunningServer) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 1500, "stream": True}
    with httpx.stream("POST", server.base + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
        assert server.state()["lanes_active"] == 1
    closed = time.monotonic()
    server.wait_for(lambda: server.state()["lanes_active"] == 0, timeout_s=3)
    assert time.monotonic() - closed < 1.0


def _worker_pid(server: RunningServer) -> int:
    return int(server.health()["worker_pid"])


def test_killed_worker_does_not_take_the_server_down_and_streams_continue() -> None:
    srv = RunningServer("--max-batch", "2", "--ctx-size", "1024").start()
    try:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 120, "temperature": 0, "stream": True}
        texts: list[str] = []
        with httpx.stream("POST", srv.base + "/v1/completions", json=body, timeout=120) as r:
            killed = False
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                event = json.loads(data)
                assert "error" not in event, event
                texts.append(event["choices"][0]["text"])
                if len(texts) == 5 and not killed:
                    os.kill(_worker_pid(srv), signal.SIGKILL)
                    killed = True
        assert killed and len("".join(texts)) > 0
        assert srv.proc is not None and srv.proc.poll() is None  # the web server is still up
        assert srv.health()["worker_restarts"] >= 1
        c = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused", max_retries=0)
        again = c.completions.create(model=MODEL, prompt="Hello", max_tokens=5)
        assert again.choices[0].text
    finally:
        srv.stop()


def test_sigterm_drains_in_flight_streams_refuses_new_ones_and_exits_zero() -> None:
    srv = RunningServer("--max-batch", "2", "--ctx-size", "1024", "--drain-timeout", "30").start()
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "stream": True}
    events: list[str] = []
    try:
        with httpx.stream("POST", srv.base + "/v1/completions", json=body, timeout=120) as r:
            lines = (line for line in r.iter_lines() if line.startswith("data: "))
            events.append(next(lines))
            assert srv.proc is not None
            srv.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            refused = httpx.post(srv.base + "/v1/completions", json={**body, "stream": False}, timeout=30)
            assert refused.status_code == 503
            events.extend(lines)
        assert events[-1] == "data: [DONE]"
        final = json.loads(events[-2][6:])
        assert "choices" in final, final
        assert final["choices"][0]["finish_reason"] == "length"
        assert srv.proc.wait(timeout=30) == 0
    finally:
        srv.stop()


def test_serve_stops_with_the_reason_when_the_model_cannot_be_loaded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A model that does not load is a configuration error: serve says why and exits non-zero
    instead of restarting the worker forever behind a server that can never answer."""
    import subprocess
    import sys

    from testkit.harness import ROOT, free_port

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)  # the magic, then nothing a loader can use
    env = {**os.environ, "SUPERFLUID_DATA_DIR": str(tmp_path)}
    argv = [sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(free_port()), "--model", str(broken)]
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "cannot load" in done.stderr and str(broken) in done.stderr, done.stderr[-2000:]
    assert "restarting" not in done.stderr
