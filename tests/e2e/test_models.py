"""Several models behind one server (serve --config): the router's order (request-priority
seed) between a request for the loaded model and one that needs a swap. The server's other
behaviour (ids, aliases, swaps under load, TTL) is tests/e2e/test_two_models.py's, and its
``--fim-model`` (pinned beside smol and Gemma: no swap slot, never a victim, so no part of these
orders) tests/e2e/test_fim_model.py's, on the same server."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from .server import RunningServer, stream_text

pytestmark = [pytest.mark.e2e, pytest.mark.model]


@pytest.fixture
def srv(models_server: RunningServer) -> RunningServer:
    """The session's several-models server (tests/conftest.py: smol and Gemma, one lane each, one
    loaded at a time, swap affinity bonus 10, and a pinned FIM model), shared with other modules:
    these tests count on /metrics as deltas."""
    return models_server


def models_state(srv: RunningServer) -> dict[str, dict]:
    return {m["id"]: m for m in httpx.get(srv.base + "/v1/internal/models", timeout=5).json()["data"]}


def metric(srv: RunningServer, line_start: str) -> float:
    for line in httpx.get(srv.base + "/metrics", timeout=5).text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{line_start} not on /metrics")


LONG = {"prompt": "Counting to five hundred: 1, 2, 3, 4, 5, 6,", "max_tokens": 80, "temperature": 0}


class Run:
    """One streamed completion on a thread; when its first token came."""

    def __init__(self, srv: RunningServer, model: str, priority: int = 0, long: bool = False) -> None:
        body = {"_path": "/v1/completions", "model": model, "stream": True, **(LONG if long else {"prompt": "Hello", "max_tokens": 4, "temperature": 0})}
        self.first = threading.Event()
        self.first_at = 0.0
        self.text = ""
        self.error: BaseException | None = None

        def on_chunk(n: int) -> None:
            if n == 1:
                self.first_at = time.monotonic()
                self.first.set()

        def run() -> None:
            try:
                self.text, _ = stream_text(srv.base, body, {"x-llamaswap-priority": str(priority)}, on_chunk=on_chunk, timeout_s=600)
            except BaseException as exc:  # noqa: BLE001 - re-raised by join()
                self.error = exc

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def join(self) -> None:
        self.thread.join(900)
        assert self.error is None, self.error
        assert self.first.is_set(), "no token arrived"


def waiting(srv: RunningServer, model: str, n: int) -> None:
    srv.wait_for(lambda: models_state(srv)[model]["waiting"] == n, timeout_s=30)


def scenario(srv: RunningServer, second: tuple[str, int], third: tuple[str, int]) -> tuple[Run, Run, Run]:
    """A long request running on smol, then ``second``, then ``third`` (model, priority)."""
    srv.wait_for(lambda: all(m["running"] == 0 for m in models_state(srv).values()), timeout_s=60)
    long = Run(srv, "smol", long=True)
    assert long.first.wait(120)
    r2 = Run(srv, *second)
    waiting(srv, second[0], 1)  # one lane each: it waits at the router, whichever model it is for
    r3 = Run(srv, *third)
    waiting(srv, third[0], 1 + (third[0] == second[0]))
    assert long.thread.is_alive(), "the long request ended before the others queued"
    for r in (long, r2, r3):
        r.join()
    return long, r2, r3


def test_with_the_bonus_the_second_request_for_the_loaded_model_starts_before_the_swap(srv: RunningServer) -> None:
    before = metric(srv, 'llamaswap_scheduler_reorders_total{reason="swap_affinity"}')
    _long, gemma, smol2 = scenario(srv, ("gemma", 0), ("smol", 0))
    assert smol2.first_at < gemma.first_at
    assert metric(srv, 'llamaswap_scheduler_reorders_total{reason="swap_affinity"}') == before + 1


def test_a_higher_priority_request_for_another_model_goes_before_a_queued_one(srv: RunningServer) -> None:
    # swap affinity gives the queued smol request 10, priority 100 on gemma beats it
    _long, smol2, gemma = scenario(srv, ("smol", 0), ("gemma", 100))
    assert gemma.first_at < smol2.first_at


def test_the_activity_rows_wait_and_first_token_count_the_wait_for_a_models_load(srv: RunningServer) -> None:
    """A request for an unloaded model waits at the router while the model loads; its activity
    row's queue wait, time to first token and total count that wait, as its client saw it (they
    were the worker's alone, from after the load)."""
    import sqlite3
    from pathlib import Path

    srv.wait_for(lambda: models_state(srv)["gemma"]["state"] == "unloaded", timeout_s=60)
    started = time.monotonic()
    r = httpx.post(srv.base + "/v1/completions", json={"model": "gemma", "prompt": "Hello", "max_tokens": 4, "temperature": 0}, timeout=300)
    seen_ms = (time.monotonic() - started) * 1000
    assert r.status_code == 200, r.text
    request_id = r.headers["x-request-id"]

    def row() -> tuple[float, ...] | None:
        with sqlite3.connect(Path(srv.data_dir) / "superfluid.sqlite3") as db:
            return db.execute(
                "SELECT serial_queue_wait_ms, queue_wait_ms, ttft_ms, total_ms FROM activity_activityentry WHERE request_id = ?", (request_id,)
            ).fetchone()

    serial_wait, queue_wait, ttft, total = srv.wait_for(row, timeout_s=30)
    assert serial_wait >= 200  # the load (a worker's start and the model's) came first
    assert queue_wait >= serial_wait * 0.9 and ttft >= queue_wait and total >= ttft
    assert total <= seen_ms + 50  # no more than the client waited
