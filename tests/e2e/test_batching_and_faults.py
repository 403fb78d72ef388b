"""Concurrency and disconnects against the real server (graceful shutdown:
test_worker_faults.py; a model that cannot load: test_startup_crash.py)."""

from __future__ import annotations

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
