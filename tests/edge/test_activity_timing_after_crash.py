"""The activity row's times of a request whose worker crashed mid-reply: counted from the
client's arrival (the web side's own clock), not from the job's arrival at the second worker."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from channels.testing import HttpCommunicator

from scheduler.core.types import TickPlan, TickResult
from scheduler.engines.sim import SimEngine
from superfluid_site.runtime import forget, install
from tests.link.conftest import transport

pytestmark = pytest.mark.django_db(transaction=True)

STALL_S = 0.6  # the first worker hangs this long after its first tokens, then dies


class StallThenCrash(SimEngine):
    """The first worker: delivers some tokens, stalls ``STALL_S`` of wall time, then crashes."""

    def __init__(self, crash_after: int) -> None:
        super().__init__(n_lanes=2, lane_ctx=512)
        self.crash_after = crash_after

    def execute(self, plan: TickPlan, should_stop: Any) -> TickResult:
        result = super().execute(plan, should_stop)
        if self.crash_after and len(self.calls) >= self.crash_after:
            time.sleep(STALL_S)
            raise RuntimeError("simulated engine crash")
        return result


async def post(body: dict[str, Any]) -> tuple[int, bytes]:
    from superfluid_site.asgi import application

    raw = json.dumps(body).encode()
    comm = HttpCommunicator(application, "POST", "/v1/chat/completions", body=raw, headers=[(b"content-type", b"application/json"), (b"host", b"127.0.0.1")])
    response = await comm.get_response(timeout=30)
    return response["status"], response["body"]


async def row_after_a_crash(monkeypatch: pytest.MonkeyPatch, crash_after: int, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """The activity row's timing of one request whose first worker stalls, then crashes after
    ``crash_after`` engine calls (a second worker finishes it), and the client's wall time (ms)."""
    import api.consumers as consumers

    rows: list[Any] = []

    async def keep(record: Any) -> None:
        rows.append(record)

    monkeypatch.setattr(consumers, "record_request", keep)
    engines: list[SimEngine] = []

    def make() -> SimEngine:
        engines.append(StallThenCrash(crash_after=crash_after) if not engines else SimEngine(n_lanes=2, lane_ctx=512))
        return engines[-1]

    link = install(transport(make))
    try:
        assert await link.wait_connected(5)
        began = time.monotonic()
        status, reply = await post(body)
        wall_ms = (time.monotonic() - began) * 1000
        assert status == 200, reply
        assert link.restarts == 1  # the job went to a second worker
    finally:
        await link.stop()
        forget(asyncio.get_running_loop())
    (row,) = rows
    return row.timing, wall_ms


@pytest.mark.parametrize("stream", [True, False])
async def test_a_resubmitted_requests_row_counts_from_the_clients_arrival(monkeypatch: pytest.MonkeyPatch, stream: bool) -> None:
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 60, "stream": stream}
    timing, wall_ms = await row_after_a_crash(monkeypatch, 20, body)
    # the client waited through the stall and the restart: the row's total says so
    assert timing["total_ms"] >= STALL_S * 1000, timing
    assert timing["total_ms"] <= wall_ms + 50, (timing, wall_ms)
    # its first token came from the first worker, before the stall
    assert timing["ttft_ms"] is not None and timing["ttft_ms"] < STALL_S * 1000, timing
    assert timing["ttft_ms"] <= timing["total_ms"]


async def test_a_job_lost_before_its_first_token_has_its_ttft_from_the_clients_arrival(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first worker dies in the job's first tick: the client's first token came only after
    the stall and the restart, and the row's ttft_ms says so."""
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
    timing, _wall_ms = await row_after_a_crash(monkeypatch, 1, body)
    assert timing["ttft_ms"] >= STALL_S * 1000 and timing["total_ms"] >= timing["ttft_ms"], timing
