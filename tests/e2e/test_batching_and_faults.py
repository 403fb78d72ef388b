"""Concurrency, disconnects and a model that cannot load, against the real server (graceful
shutdown: test_worker_faults.py)."""

from __future__ import annotations

import os

import pytest

from .server import RunningServer, assert_a_disconnect_frees_the_lane, assert_streams_batched, lane_count, openai_chat

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"


def stream_chat(base: str, content: str, max_tokens: int) -> tuple[str, str]:
    return openai_chat(base, MODEL, [{"role": "user", "content": content}], max_tokens)


def test_as_many_concurrent_streams_as_lanes_are_batched_in_one_worker_and_all_complete(server: RunningServer) -> None:
    lanes = lane_count(server)
    assert lanes >= 4
    assert_streams_batched(server, lanes, lambda i: stream_chat(server.base, f"Count to {i + 3}.", 48), interval_s=0.02, idle_s=30)


def test_client_disconnect_cancels_the_job_and_frees_its_lane(server: RunningServer) -> None:
    assert_a_disconnect_frees_the_lane(server, MODEL, max_tokens=1500, lines_before_closing=3, timeout_s=30)


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
