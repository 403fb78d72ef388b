"""A fleet head's view of the whole fleet: the dashboard's Queue and Lanes panels, /slots,
/v1/internal/state and the queue-depth metrics. They were the first worker's (by id) shown as
the fleet's: the Queue panel read "total 0" while jobs waited in Redis, and /slots listed one
worker's lanes (``?fail_on_no_slot`` answered 503 while another worker had idle lanes)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from dashboard.feed import dashboard_state
from scheduler.engines.sim import SimEngine
from scheduler.link.redis_transport import RedisTransport
from tests.edge.inproc import request

from .conftest import RedisServer, SimFleetWorker, answer_each, completion, head
from .test_fleet_sim import slow_sim


def worker_state(
    host: str, lanes: list[str | None], queued: dict[str, int], parked: int = 0, lane_ctx: int = 512, *, model: str = "sim", draining: bool = False
) -> dict[str, Any]:
    """One worker's snapshot as it publishes it: ``lanes`` the job id of each lane (None: idle)."""
    return {
        "model": model,
        "draining": draining,
        "engine": "sim",
        "host": host,
        "pid": 1,
        "n_lanes": len(lanes),
        "lane_ctx": lane_ctx,
        "lanes": [{"lane": i, "state": "idle"} if j is None else {"lane": i, "state": "decode", "job_id": j, "class": "agent"} for i, j in enumerate(lanes)],
        "queue_depth": {"interactive": 0, "completion": 0, "agent": 0, "background": 0, **queued},
        "parked": [{"job_id": f"{host}-p{i}", "class": "agent", "tokens": 10} for i in range(parked)],
        "prefill_tokens_per_s": 100.0,
        "metrics": {"lanes_total": len(lanes), "queue_depth_by_class": {"interactive": 0, "completion": 0, "agent": 0, "background": 0, **queued}},
    }


def fleet_head(workers: dict[str, dict[str, Any]], in_redis: dict[str, int]) -> RedisTransport:
    link = RedisTransport("redis://127.0.0.1:1/0", prefix="view:")  # never connects: the view alone
    link.workers = workers
    link.global_queue = {"interactive": 0, "completion": 0, "agent": 0, "background": 0, **in_redis}
    link._publish_fleet()
    return link


def queue_depth_metric(state: dict[str, Any]) -> dict[str, float]:
    from api.metrics import snapshot_families

    return {s.labels["class"]: s.value for fam in snapshot_families(state) for s in fam.samples if s.name == "superfluid_queue_depth"}


def test_the_fleets_queue_is_what_waits_in_redis_and_at_every_worker() -> None:
    # the first worker (by id) has nothing queued; the second has 1 agent job; Redis holds 4
    link = fleet_head({"a": worker_state("h1", ["j1", "j2"], {}), "b": worker_state("h2", ["j3", None], {"agent": 1})}, {"agent": 3, "interactive": 1})
    state = link.snapshot
    assert state is not None
    assert state["queue_depth"] == {"interactive": 1, "completion": 0, "agent": 4, "background": 0}  # was the first worker's: all 0
    assert state["global_queue"]["agent"] == 3  # the part in Redis, as before
    page = dashboard_state(state)
    assert sum(page["queue_depth"].values()) == 5  # the Queue panel's total (was 0)
    assert queue_depth_metric(state) == {"interactive": 1.0, "completion": 0.0, "agent": 4.0, "background": 0.0}  # was the workers' 0 and 1


def test_with_no_worker_left_the_queue_still_counts_the_jobs_in_redis() -> None:
    link = fleet_head({"a": worker_state("h1", ["j1"], {})}, {})
    link.workers = {}
    link.global_queue = {"interactive": 0, "completion": 0, "agent": 2, "background": 0}
    link._publish_fleet()
    state = link.snapshot
    assert state is not None and state["fleet"] == []
    assert dashboard_state(state)["queue_depth"]["agent"] == 2  # was absent: "total 0"
    assert queue_depth_metric(state)["agent"] == 2.0


def test_the_fleets_lanes_are_every_workers_numbered_across_the_fleet() -> None:
    link = fleet_head({"a": worker_state("h1", ["j1", "j2"], {}, parked=1), "b": worker_state("h2", [None, "j3", None], {}, parked=1, lane_ctx=1024)}, {})
    state = link.snapshot
    assert state is not None
    assert state["n_lanes"] == 5 and [lane["lane"] for lane in state["lanes"]] == [0, 1, 2, 3, 4]  # was the first worker's 2
    assert [(lane["host"], lane["worker_lane"], lane.get("job_id")) for lane in state["lanes"]] == [
        ("h1", 0, "j1"), ("h1", 1, "j2"), ("h2", 0, None), ("h2", 1, "j3"), ("h2", 2, None),
    ]  # fmt: skip
    assert [p["host"] for p in state["parked"]] == ["h1", "h2"]
    assert state["prefill_tokens_per_s"] == 200.0
    page = dashboard_state(state)
    assert page["n_lanes"] == 5 and len(page["lanes"]) == 5


@pytest.mark.django_db(transaction=True)
async def test_slots_lists_every_workers_lanes_and_fails_on_no_slot_only_when_the_fleet_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    from api import views

    link = fleet_head({"a": worker_state("h1", ["j1", "j2"], {}), "b": worker_state("h2", [None, "j3"], {}, lane_ctx=1024)}, {})
    monkeypatch.setattr(views, "get_link", lambda: SimpleNamespace(snapshot=link.snapshot, connected=True))
    reply = await request("GET", "/slots?fail_on_no_slot=1")
    assert reply.status == 200, reply.body  # the first worker is full, the second has an idle lane (was 503)
    slots = reply.json()
    assert [s["id"] for s in slots] == [0, 1, 2, 3]
    assert [(s["host"], s["is_processing"], s["n_ctx"]) for s in slots] == [("h1", True, 512), ("h1", True, 512), ("h2", False, 1024), ("h2", True, 1024)]
    full = fleet_head({"a": worker_state("h1", ["j1"], {}), "b": worker_state("h2", ["j2"], {})}, {})
    monkeypatch.setattr(views, "get_link", lambda: SimpleNamespace(snapshot=full.snapshot, connected=True))
    assert (await request("GET", "/slots?fail_on_no_slot=1")).status == 503


async def test_a_heads_queue_panel_counts_the_jobs_waiting_in_redis(redis_server: RedisServer, prefix: str) -> None:
    """A real fleet: one two-lane worker, busy; the jobs beyond its lanes wait in Redis. The
    head's Queue panel (and /v1/internal/state's ``queue_depth``) counted the worker's own queue
    only: 0."""
    worker = SimFleetWorker(redis_server.url, prefix, engine=slow_sim(0.01)).start()
    link = await head(redis_server.url, prefix)
    try:
        handles = [await link.submit(request=completion(f"prompt {i}", max_tokens=30)) for i in range(6)]
        deadline = time.monotonic() + 20
        while True:
            state = link.snapshot or {}
            in_redis = sum((state.get("global_queue") or {}).values())
            if in_redis > 0 and sum(1 for lane in state.get("lanes", []) if lane.get("job_id")) == 2:
                break
            assert time.monotonic() < deadline, state
            await asyncio.sleep(0.02)
        at_workers = sum(sum((w.get("queue_depth") or {}).values()) for w in link.workers.values())
        page = dashboard_state(state)
        assert sum(page["queue_depth"].values()) == in_redis + at_workers >= 1
        await answer_each(link, handles)
    finally:
        await link.stop()
        worker.stop()



def push_to_page(push: dict[str, Any], script: str) -> Any:
    """The page itself (headless chromium, with tests/dashboard/test_page.py's stand-in socket)
    given one push: what ``script`` reads of it."""
    from tests.dashboard.test_page import fake_page, fresh

    with fake_page() as pg:
        fresh(pg).evaluate("(s) => window.__push(s)", {**push, "t": 1_800_000_000.0})
        return pg.evaluate(script)


def test_one_workers_drain_is_its_own_not_the_fleets() -> None:
    """A rolling restart drains one worker: the dashboard's header said the whole server was
    draining when that worker was the first by id (and nothing when it was another), and the
    Fleet panel did not say which worker drains; nor which worker serves another model."""
    link = fleet_head({"a": worker_state("h1", [None], {}, draining=True), "b": worker_state("h2", [None], {}, model="sim-2")}, {})
    state = link.snapshot
    assert state is not None
    assert state["draining"] is False  # was the first worker's: True
    assert [(w["host"], w["draining"], w["model"]) for w in state["fleet"]] == [("h1", True, "sim"), ("h2", False, "sim-2")]
    header, fleet = push_to_page(dashboard_state(state), "() => [document.getElementById('model').textContent, document.getElementById('fleet').innerText]")
    assert "draining" not in header
    rows = fleet.split("\n")
    assert "draining" in rows[0] and "sim-2" not in rows[0] and "sim-2" in rows[1] and "draining" not in rows[1], rows
    both = fleet_head({"a": worker_state("h1", [None], {}, draining=True), "b": worker_state("h2", [None], {}, draining=True)}, {})
    assert both.snapshot is not None and both.snapshot["draining"] is True


def test_the_dashboards_queue_panel_shows_the_fleets_queue_and_each_lanes_host() -> None:
    """The page: the Queue panel's total, said to be the fleet's, and which host each lane is on."""
    link = fleet_head({"a": worker_state("h1", ["j1", "j2"], {}), "b": worker_state("h2", [None, "j3"], {"agent": 1})}, {"agent": 3})
    total, scope, ids, tick = push_to_page(
        dashboard_state(link.snapshot or {}),
        """() => [document.querySelector('#queue [data-key=total]').textContent, document.getElementById('queue-scope').textContent,
                  Array.from(document.querySelectorAll('#lanes .id')).map((e) => e.textContent), document.getElementById('tick-no').textContent]""",
    )
    assert "last tick of h1" in tick  # the Tick panel's last tick is one worker's: named
    assert total == "4" and "Redis" in scope  # was "0": the first worker's own queue
    assert ids == ["lane 0 · h1", "lane 1 · h1", "lane 2 · h2", "lane 3 · h2"]  # was "lane 0", "lane 1" (one worker's)

async def test_after_a_rolling_restart_the_head_speaks_for_a_worker_still_there(redis_server: RedisServer, prefix: str) -> None:
    """The head's idea of the worker (model, context per request, pid) was the first worker it
    saw, kept until no worker at all was left: after a rolling restart to a larger context
    (a new worker up, then the old one stopped) /v1/models' context_length and the context
    requests are checked against stayed the old worker's, and /health named its pid."""
    old = SimFleetWorker(redis_server.url, prefix, engine=SimEngine(n_lanes=2, lane_ctx=512)).start()
    link = await head(redis_server.url, prefix)
    new = None
    try:
        assert link.hello is not None and link.hello.lane_ctx == 512
        new = SimFleetWorker(redis_server.url, prefix, engine=SimEngine(n_lanes=2, lane_ctx=1024)).start()
        await until(lambda: len(link.workers) == 2, "the new worker joined")
        old.stop()  # drains and leaves the fleet
        await until(lambda: list(link.workers) == [new.link.worker_id], "the old worker left")
        await until(lambda: link.hello is not None and link.hello.lane_ctx == 1024, f"the head still has {link.hello}")
        handle = await link.submit(request=completion("a prompt", max_tokens=5))
        await answer_each(link, [handle])
    finally:
        await link.stop()
        old.stop()
        if new is not None:
            new.stop()


async def until(check: Any, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


@pytest.mark.django_db(transaction=True)
async def test_props_total_slots_counts_every_workers_lanes(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-server's /props ``total_slots`` (clients size their concurrency by it) was the first
    worker's lane count on a fleet head that sends requests to every worker."""
    from api import views
    from scheduler.link.messages import Hello

    link = fleet_head({"a": worker_state("h1", ["j1", None], {}), "b": worker_state("h2", [None, None, None], {})}, {})
    hello = Hello(model="sim", engine="sim", n_lanes=2, lane_ctx=512, pid=1)
    fake = SimpleNamespace(snapshot=link.snapshot, connected=True, hello=hello, wait_connected=lambda _t: asyncio.sleep(0, True))
    monkeypatch.setattr(views, "get_pool", lambda: None)
    monkeypatch.setattr(views, "get_link", lambda: fake)
    props = (await request("GET", "/props")).json()
    assert props["total_slots"] == 5 and props["default_generation_settings"]["n_ctx"] == 512  # was 2


@pytest.mark.django_db(transaction=True)
async def test_slots_of_a_head_cut_off_from_redis_shows_no_busy_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a head cannot reach Redis the lanes it last read are nobody's present state: /slots
    showed them busy, frozen, for as long as Redis stayed away (its /metrics leaves them out)."""
    from api import views

    link = fleet_head({"a": worker_state("h1", ["j1", "j2"], {})}, {})
    fake = SimpleNamespace(snapshot=link.snapshot, connected=False, redis_ok=False)
    monkeypatch.setattr(views, "get_link", lambda: fake)
    slots = (await request("GET", "/slots")).json()
    assert [s["is_processing"] for s in slots] == [False, False]  # was [True, True]
    fake.redis_ok, fake.connected = True, True
    assert [s["is_processing"] for s in (await request("GET", "/slots")).json()] == [True, True]


def test_the_fleets_stats_are_the_fleets_not_the_first_workers() -> None:
    """/v1/internal/state's ``stats`` (peak lanes, tokens, last TTFT) were the first worker's."""

    def with_stats(state: dict[str, Any], requests: int, tokens: int, peak: int, last_ttft_ms: float, first_tokens: int) -> dict[str, Any]:
        ttft = {"agent": {"le": [1.0], "buckets": [first_tokens], "sum": 0.5, "count": first_tokens}}
        stats = {"requests_total": requests, "completion_tokens_total": tokens, "peak_lanes_active": peak, "last_ttft_ms": last_ttft_ms, "tick_seconds_total": 1.0}
        return {**state, "stats": stats, "metrics": {**state["metrics"], "requests_total": requests, "completion_tokens_total": tokens, "ttft_s": ttft}}

    a = with_stats(worker_state("h1", ["j1", "j2"], {}), 10, 100, 2, 50.0, 10)
    b = with_stats(worker_state("h2", ["j3", None], {}), 5, 40, 1, 80.0, 5)
    link = fleet_head({"a": a, "b": b}, {})
    stats = (link.snapshot or {})["stats"]
    assert stats["requests_total"] == 15 and stats["completion_tokens_total"] == 140  # were the first worker's 10 and 100
    assert stats["peak_lanes_active"] == 3  # three lanes busy at once across the fleet (was 2)
    assert [w["stats"]["requests_total"] for w in (link.snapshot or {})["fleet"]] == [10, 5]  # each worker's own
    link.workers = {"a": a, "b": with_stats(b, 6, 50, 1, 120.0, 6)}  # the second worker's first token came last
    link._publish_fleet()
    assert (link.snapshot or {})["stats"]["last_ttft_ms"] == 120.0  # was the first worker's 50
    assert dashboard_state(link.snapshot or {})["last_ttft_ms"] == 120.0
