"""The dashboard page's own script in headless chromium, without a server: the page as the view
renders it, its websocket replaced by a stand-in through which the test hands it pushes built by
the feed (dashboard/feed.py), exactly as the consumer relays them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.template.loader import render_to_string
from django.test import RequestFactory

from dashboard.feed import dashboard_state, full_state
from scheduler.link import pool as pool_mod
from scheduler.link.pool import ModelPool, PoolSetup
from scheduler.models_config import ModelsConfig, ServedModel
from testkit.harness import CHROMIUM, CHROMIUM_ARGS

from .test_browser import require_chromium

URL = "http://dashboard.test/dashboard/"

# The page's websocket: a stand-in the test pushes through (window.__push(state)).
FAKE_SOCKET = """
window.WebSocket = function (url) {
  var ws = this;
  window.__push = function (state) { ws.onmessage({ data: JSON.stringify({ type: "state", state: state }) }); };
  setTimeout(function () { ws.onopen && ws.onopen(); }, 0);
};
"""

# Hands the page each push in turn; what it shows after each.
FEED = """
(pushes) => pushes.map((s) => {
  window.__push(s);
  return {
    decode: document.getElementById('decode-now').textContent,
    ttft: document.getElementById('ttft-now').textContent,
    events: Array.from(document.querySelectorAll('#events li')).map((li) => li.textContent.replace(/^.*?  /, '')),
  };
})
"""


def page_html() -> str:
    request = RequestFactory().get("/dashboard/")
    request.user = SimpleNamespace(get_username=lambda: "ops")  # type: ignore[assignment]
    return render_to_string("dashboard/index.html", {"push_interval_ms": 200, "request": request})


@contextlib.contextmanager
def fake_page() -> Iterator[Any]:
    """Headless chromium on the dashboard's page, its socket the stand-in (FAKE_SOCKET): pushes
    are given with ``window.__push`` once the page is loaded (:func:`fresh`)."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    html = page_html()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            pg = browser.new_page()
            pg.add_init_script(FAKE_SOCKET)
            pg.route(URL, lambda route: route.fulfill(status=200, content_type="text/html", body=html))
            yield pg
        finally:
            browser.close()


@pytest.fixture(scope="module")
def page() -> Iterator[Any]:
    with fake_page() as pg:
        yield pg


def fresh(page: Any) -> Any:
    page.goto(URL)
    page.wait_for_function("() => typeof window.__push === 'function'")
    return page


def clocked_page(page: Any) -> Any:
    """A page of its own on the dashboard, with the fake socket and a clock the test moves."""
    pg = page.context.browser.new_page()
    pg.clock.install()
    pg.add_init_script(FAKE_SOCKET)
    pg.route(URL, lambda route: route.fulfill(status=200, content_type="text/html", body=page_html()))
    return fresh(pg)


def worker(pid: int, decode: int, ttft: tuple[float, int], preemptions: int) -> dict[str, Any]:
    return {
        "pid": pid, "lanes": [{"lane": 0, "state": "decode", "job_id": f"job-{pid}", "generated": 1}],
        "metrics": {"decode_tokens_total": decode, "ttft_s": {"agent": {"sum": ttft[0], "count": ttft[1]}}},
        "counters": {"preemptions": preemptions},
    }


def pool_pushes() -> list[dict[str, Any]]:
    """Five pushes, 0.2 s apart, of a pool whose model used last goes a, a, b, b, b: the chat
    model a decodes 50 tok/s; the FIM model b has been busy for hours (large counts) and, by the
    last push, has given one first token (0.5 s) and preempted once."""
    cfg = ModelsConfig((ServedModel("a", Path("/m/a.gguf")), ServedModel("b", Path("/m/b.gguf"))))
    pool = ModelPool(PoolSetup(cfg, spawn=lambda *_: None))  # type: ignore[arg-type]

    loop = asyncio.new_event_loop()  # the pool's (never run: the feed only reads its state)
    pool.loop = loop
    pool_mod._POOLS[-1] = pool
    try:
        pushes = []
        for k, last in enumerate("aabbb"):
            b_done = k == 4
            pool.links = {
                "a": SimpleNamespace(snapshot=worker(101, 1000 + 10 * k, (2.0, 10), 3), inflight={}),  # type: ignore[dict-item]
                "b": SimpleNamespace(snapshot=worker(202, 400000, (900.5, 4001) if b_done else (900.0, 4000), 1 if b_done else 0), inflight={}),  # type: ignore[dict-item]
            }
            pool.last_model = last
            pushes.append({**full_state({}, loop), "t": 1_800_000_000.0 + 0.2 * k})
        return pushes
    finally:
        pool_mod._POOLS.pop(-1, None)
        loop.close()


def test_with_several_models_no_rate_or_event_compares_two_models_counts(page: Any) -> None:
    """The page took each push's counts as one worker's: as the model used last changed, it read
    b's counts against a's: a decode rate of a million tok/s, a TTFT point of 225 ms, and no
    preemption of b's when it happened."""
    pushes = pool_pushes()
    shown = fresh(page).evaluate(FEED, pushes)
    decode = [float(s["decode"]) for s in shown]
    assert decode[0] == 0 and all(abs(d - 50) < 0.5 for d in decode[1:]), decode  # a's 50 tok/s throughout
    assert [s["ttft"] for s in shown] == ["–"] * 4 + ["500"]  # b's one new first token, nothing else
    assert [s["events"] for s in shown] == [["none yet"]] * 4 + [["preemption · b"]]


def test_with_one_model_rates_and_events_are_as_before(page: Any) -> None:
    states = [worker(7, 100 + 10 * k, (1.0 + 0.3 * (k >= 2), 4 + (k >= 2)), 2 + (k >= 3)) for k in range(4)]
    pushes = [{**dashboard_state(s), "t": 1_800_000_000.0 + 0.2 * k} for k, s in enumerate(states)]
    shown = fresh(page).evaluate(FEED, pushes)
    assert [s["decode"] for s in shown] == ["0.0", "50.0", "50.0", "50.0"]
    assert [s["ttft"] for s in shown] == ["–", "–", "300", "300"]  # one first token, in 0.3 s
    assert [s["events"] for s in shown] == [["none yet"]] * 3 + [["preemption"]]


def test_a_lane_shows_the_workers_state_for_it(page: Any) -> None:
    """The page drew a lane whose entry said ``parked: true`` as parked; a worker's lane never
    says so (a parked job waits in the queue, listed under Parked), so the branch is gone."""
    state = dashboard_state({"lanes": [{"lane": 0, "state": "decode", "job_id": "j", "parked": True}, {"lane": 1, "state": "idle"}],
                             "parked": [{"job_id": "parked-job", "class": "background", "tokens": 300}]})
    pg = fresh(page)
    pg.evaluate("(s) => window.__push(s)", {**state, "t": 1_800_000_000.0})
    assert pg.evaluate("() => Array.from(document.querySelectorAll('#lanes [data-lane]')).map((c) => [c.dataset.state, c.dataset.parked === undefined])") == [
        ["decode", True], ["idle", True]]
    assert "background · parked-" in pg.locator("#parked").inner_text()


def test_a_page_that_stops_getting_pushes_says_its_state_is_old_and_live_again_when_they_return(page: Any) -> None:
    """Pushes come only with worker snapshots: with the worker gone (crashed, restarting, loading
    its model) the page kept the last lanes decoding under a green "live" for as long as it
    stayed open."""
    pg = clocked_page(page)
    try:
        state = dashboard_state({"lanes": [{"lane": 0, "state": "decode", "job_id": "j", "generated": 5}]})

        def conn() -> tuple[str, str]:
            return tuple(pg.evaluate("() => { const c = document.getElementById('conn'); return [c.dataset.status, c.textContent]; }"))

        pg.evaluate("(s) => window.__push(s)", {**state, "t": 1_800_000_000.0})
        pg.clock.run_for(1000)
        assert conn() == ("live", "live")
        pg.clock.run_for(9000)  # ten seconds without a push
        status, text = conn()
        assert status == "stale" and text.startswith("no update for ") and pg.evaluate("() => document.body.classList.contains('stale')")
        pg.evaluate("(s) => window.__push(s)", {**state, "t": 1_800_000_010.0})
        assert conn() == ("live", "live") and not pg.evaluate("() => document.body.classList.contains('stale')")
        # several models, none loaded: no worker runs to send anything, and nothing is old
        unloaded = {**state, "models": [{"id": "m", "fim": False, "state": "unloaded", "n_lanes": 1, "lanes_in_use": 0, "waiting": 0, "lanes": []}]}
        pg.evaluate("(s) => window.__push(s)", {**unloaded, "t": 1_800_000_011.0})
        pg.clock.run_for(10_000)
        assert conn() == ("live", "live")
    finally:
        pg.close()


def several_models_push(state: dict[str, Any], loading: str | None = None) -> dict[str, Any]:
    """The feed's push with several models (``a`` and ``b``, none loaded; ``loading`` asked to
    load), as the consumer relays it."""
    cfg = ModelsConfig((ServedModel("a", Path("/m/a.gguf")), ServedModel("b", Path("/m/b.gguf"))))
    pool = ModelPool(PoolSetup(cfg, spawn=lambda *_: None))  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    pool.loop = loop
    pool_mod._POOLS[-1] = pool
    try:
        if loading is not None:
            pool.router.request_load(loading)
            pool.router.schedule()
        return {**full_state(state, loop), "t": 1_800_000_000.0}
    finally:
        pool_mod._POOLS.pop(-1, None)
        loop.close()


def test_with_several_models_and_none_resident_the_page_stays_live(page: Any) -> None:
    """The feed lists resident models only, so with none loaded a push's ``models`` is empty: the
    page took that for a worker gone and said "no update for N s" (no worker runs to send any)."""
    push = several_models_push({})
    assert push["models"] == []  # what the feed really sends with nothing resident
    pg = clocked_page(page)
    try:
        pg.evaluate("(s) => window.__push(s)", push)
        pg.clock.run_for(10_000)
        assert pg.evaluate("() => document.getElementById('conn').dataset.status") == "live"
        assert not pg.evaluate("() => document.body.classList.contains('stale')")
        assert pg.locator("#model").inner_text() == "no model loaded"
    finally:
        pg.close()


def test_the_fleet_panel_says_so_when_no_worker_is_left(page: Any) -> None:
    """The head's snapshot with no worker left has an empty fleet; the feed dropped it as if not
    in Redis mode, so the page's Fleet panel kept the gone worker's busy lanes and the old global
    queue for as long as no worker came back."""
    lanes = [{"lane": 0, "state": "decode", "job_id": "j"}]
    busy = dashboard_state({"n_lanes": 1, "lanes": lanes, "fleet": [{"worker": "h1:42:abc", "host": "h1", "lanes": lanes, "n_lanes": 1}], "global_queue": {"agent": 1}})
    gone = dashboard_state({"n_lanes": 0, "lanes": [], "fleet": [], "global_queue": {"agent": 3}})
    assert gone["fleet"] == [] and gone["global_queue"] == {"agent": 3}
    pg = fresh(page)
    shown = "() => [document.getElementById('fleet').innerText, document.querySelector('#global-queue [data-key=agent]').textContent]"
    pg.evaluate("(s) => window.__push(s)", {**busy, "t": 1_800_000_000.0})
    assert pg.evaluate(shown) == ["h1 · 42\t1/1 lanes busy", "1"]
    pg.evaluate("(s) => window.__push(s)", {**gone, "t": 1_800_000_001.0})
    fleet, agent = pg.evaluate(shown)
    assert "lanes busy" not in fleet and "no worker" in fleet and agent == "3"


def test_while_the_first_model_loads_the_header_says_no_model_is_loaded(page: Any) -> None:
    """A model loading is resident, so the push's ``models`` is not empty, but no worker has sent
    a snapshot yet: the header read "? ·  · 0 lanes × 0 ctx" for the whole load."""
    push = several_models_push({"router": "waiting for a load"}, loading="a")  # its worker has not said hello
    assert [m["state"] for m in push["models"]] == ["loading"] and push["model"] is None
    pg = clocked_page(page)
    try:
        pg.evaluate("(s) => window.__push(s)", push)
        pg.clock.run_for(10_000)
        assert pg.evaluate("() => document.getElementById('conn').dataset.status") == "live"
        assert pg.locator("#model").inner_text() == "no model loaded"
    finally:
        pg.close()
