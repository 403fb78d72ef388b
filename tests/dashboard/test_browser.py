"""The dashboard in a real headless browser (Debian's chromium, driven by playwright) against the
real server: log in through the admin form, watch a real request's lane go prefill -> decode -> idle.

Set SUPERFLUID_UPDATE_SCREENSHOT=1 to refresh docs/dashboard.png from this run.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.harness import CHROMIUM, CHROMIUM_ARGS, ROOT, RunningServer, create_superuser

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"
USER, PASSWORD = "ops", "dashboard-test-pw"

# records every lane state the page shows: [time, lane, state, job]
RECORDER = """
() => {
  window.__seen = [];
  const note = (card) => window.__seen.push([Date.now(), card.dataset.lane, card.dataset.state, card.dataset.job]);
  document.querySelectorAll('[data-lane]').forEach(note);
  new MutationObserver((records) => {
    for (const r of records) { if (r.target.dataset && r.target.dataset.lane !== undefined) note(r.target); }
  }).observe(document.getElementById('lanes'), {subtree: true, attributes: true, attributeFilter: ['data-state', 'data-job']});
}
"""


def require_chromium() -> None:
    if CHROMIUM is None:
        message = "chromium is not installed (apt-get install chromium; .ci/run and the README's test command do)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs it: a skip there would hide a broken install step
        pytest.skip(message)


@pytest.fixture(scope="module")
def server(shared_server: RunningServer) -> RunningServer:
    """The session's shared real server (four lanes), with the superuser USER the browser logs
    in as."""
    require_chromium()
    create_superuser(shared_server, USER, PASSWORD)
    return shared_server


def long_prompt(n_words: int = 480, seed: int | None = None) -> str:
    """About 1500 tokens (480 words) that no earlier request shared (so no prefix cache hit),
    asking for a count the model keeps going with (so decoding lasts)."""
    rng = random.Random(seed if seed is not None else time.time_ns())
    words = ["river", "stone", "amber", "falcon", "quiet", "lantern", "meadow", "copper", "harbor", "willow", "ember", "orchard"]
    text = " ".join(f"{rng.choice(words)}{rng.randrange(100)}" for _ in range(n_words))
    return f"Notes: {text}\n\nIgnore the notes. Count from 1 to 100, separated by commas."


def stream_chat(base: str, content: str, max_tokens: int, out: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    """A streamed chat request; its job id (x-request-id) is in ``out`` as soon as it is queued
    (a chat stream sends its headers and role chunk right away)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0, "stream": True}
    try:
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, headers=headers or {}, timeout=300) as r:
            out["job"] = r.headers.get("x-request-id")
            out["status"] = r.status_code
            out["events"] = sum(1 for line in r.iter_lines() if line.startswith("data: "))
    except httpx.HTTPError as exc:  # reported by the test's assertions, not lost in the thread
        out["error"] = repr(exc)


def test_the_dashboard_shows_a_real_request_go_from_prefill_to_decode_to_idle(server: RunningServer, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1100})
            page.goto(server.base + "/dashboard/")
            assert "/admin/login/" in page.url and "next=/dashboard/" in page.url  # anonymous: the login page
            page.fill("#id_username", USER)
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url("**/dashboard/")
            page.wait_for_selector("#conn[data-status=live]", timeout=15000)
            page.wait_for_selector("[data-lane='3']", timeout=15000)  # the first state has arrived
            assert page.locator("[data-lane][data-state=idle]").count() == 4
            page.evaluate(RECORDER)

            tracked: dict[str, Any] = {}
            stop_load = threading.Event()
            background: list[dict[str, Any]] = []

            def load(i: int) -> None:
                """Background stories, one after another, until told to stop: the lanes beside ours."""
                n = 0
                while not stop_load.is_set():
                    out: dict[str, Any] = {}
                    background.append(out)
                    stream_chat(server.base, f"Write a story about baker number {i}-{n}.", 64, out, {"x-superfluid-qos": "background"})
                    n += 1

            ours = threading.Thread(target=stream_chat, args=(server.base, long_prompt(), 48, tracked))
            ours.start()
            page.wait_for_function("() => window.__seen.some(s => s[2] === 'prefill')", timeout=60000)
            loaders = [threading.Thread(target=load, args=(i,)) for i in range(2)]
            for t in loaders:
                t.start()
            try:
                deadline = time.monotonic() + 60
                while "job" not in tracked and "error" not in tracked and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert tracked.get("job"), tracked
                # under load: our lane decoding beside background lanes
                page.wait_for_function(
                    "(job) => document.querySelector(`[data-job='${job}'][data-state=decode]`) && document.querySelectorAll('[data-lane]:not([data-state=idle])').length >= 2",
                    arg=tracked["job"],
                    timeout=600000,  # seconds on an idle machine; minutes when the cores are shared
                )
                page.wait_for_timeout(1200)  # a few pushes, so the charts have a line
                shot = tmp_path / "dashboard.png"
                page.screenshot(path=str(shot), full_page=True)
                if os.environ.get("SUPERFLUID_UPDATE_SCREENSHOT"):
                    shutil.copy(shot, ROOT / "docs" / "dashboard.png")
            finally:
                stop_load.set()  # no new request may take our lane once it is free
                ours.join(timeout=600)
                for t in loaders:
                    t.join(timeout=600)
            assert all(out.get("status") == 200 for out in background), background
            assert tracked.get("status") == 200 and tracked.get("job"), tracked
            page.wait_for_function("() => document.querySelectorAll('[data-lane][data-state=idle]').length === 4", timeout=60000)
            seen: list[list[Any]] = page.evaluate("() => window.__seen")
            decode_rate = page.locator("#decode-now").inner_text()
        finally:
            browser.close()

    job = tracked["job"]
    ours_seen = [(t, lane, state) for t, lane, state, j in seen if j == job]
    # The job may change lanes while it decodes: lane compaction (docs/scheduling.md) moves a
    # decoding lane into a hole the background stories left, KV and all. It is never prefilled
    # again (it is the only agent, so nothing preempts it): across its lanes it reads prefill,
    # then decode, and a lane it moved into shows it decoding from the start. (Idle at the end is
    # the wait for four idle lanes above.)
    story = [s for i, (_, _, s) in enumerate(ours_seen) if i == 0 or s != ours_seen[i - 1][2]]
    assert story == ["prefill", "decode"], ours_seen
    for (_, before, _), (_, after, state) in zip(ours_seen, ours_seen[1:], strict=False):
        assert after == before or state == "decode", ours_seen
    assert decode_rate not in ("", "–")
