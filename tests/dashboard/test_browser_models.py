"""The dashboard and the admin's model page in a real headless browser on the session's
several-models server (tests/conftest.py: ``models_server``): ``smol`` (one lane) and Gemma, one
loaded at a time, and the bundled GGUF as ``--fim-model`` (two lanes, resident). The page shows
each resident model's lanes and what waits at the router, by band, as real requests come and go."""

from __future__ import annotations

import pytest

from testkit.harness import CHROMIUM, CHROMIUM_ARGS, RunningServer, admin_page, create_superuser
from tests.e2e.test_fim_model import FIM, MAIN, ask_for
from tests.e2e.test_models import Run

from .test_browser import PASSWORD, USER, require_chromium

pytestmark = [pytest.mark.e2e, pytest.mark.model]

@pytest.fixture(scope="module")
def server(models_server: RunningServer) -> RunningServer:
    """The session's several-models server (tests/conftest.py), with the superuser the browser
    logs in as."""
    require_chromium()
    create_superuser(models_server, USER, PASSWORD)
    return models_server


def depth(page, band: str) -> str:  # type: ignore[no-untyped-def]
    return page.locator(f"#router-queue tr[data-band={band}] .depth").inner_text()


def test_every_resident_models_lanes_and_the_router_queue_by_band(server: RunningServer) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            ask_for(server, MAIN)  # smol in the one slot (a test before may have left Gemma there, or neither)
            page = admin_page(browser, server.base, USER, PASSWORD)
            main, fim = f"#models [data-model='{MAIN}']", f"#models [data-model='{FIM}']"
            page.wait_for_selector(f"{main}[data-state=loaded]", timeout=60000)
            page.wait_for_selector(f"{fim}[data-state=loaded]", timeout=60000)
            assert page.locator(f"{main} .chip").count() == 1 and page.locator(f"{fim} .chip").count() == 2
            assert page.locator("#models [data-model='gemma']").count() == 0  # not resident: no card
            assert "(FIM)" in page.locator(f"{fim} .name").inner_text()
            assert depth(page, "normal") == "0"

            long = Run(server, MAIN, long=True)  # takes the main model's one lane
            assert long.first.wait(120)
            queued = Run(server, MAIN)  # waits at the router for that lane, in the normal band
            page.wait_for_selector(f"{main}[data-busy='1'] .chip[data-state=decode]", timeout=60000)
            page.wait_for_function("() => document.querySelector('#router-queue tr[data-band=normal] .depth').textContent === '1'", timeout=60000)
            assert depth(page, "batch") == "0" and depth(page, "interactive") == "0"
            assert page.locator(f"{fim}[data-busy='0']").count() == 1  # the FIM model's lanes stay free
            assert long.thread.is_alive(), "the long request ended before the page was read"
            long.join()
            queued.join()
            page.wait_for_function("() => document.querySelector('#router-queue tr[data-band=normal] .depth').textContent === '0'", timeout=60000)
            page.wait_for_selector(f"{main}[data-busy='0']", timeout=60000)

            # the admin's page lists every configured model, the two resident ones with their lanes
            page.goto(server.base + "/admin/dashboard/servedmodel/")
            rows = {r.get_attribute("data-model"): r.locator("td.state").inner_text() for r in page.locator("#served-models tr.model").all()}
            assert rows == {MAIN: "loaded", "gemma": "unloaded", FIM: "loaded"}
            assert page.locator(f"#served-models tr[data-model='{FIM}'] td.lanes").inner_text() == "0 / 2"
        finally:
            browser.close()
