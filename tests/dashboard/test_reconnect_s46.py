"""What the dashboard's header says while its websocket cannot connect: a server that is down
(restarting, loading its model) against a session that may no longer see the page. The page's
own script in headless chromium, its websocket a stand-in and its clock the test's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dashboard.feed import dashboard_state
from testkit.harness import CHROMIUM, CHROMIUM_ARGS

from .test_browser import require_chromium
from .test_page import URL, page_html

# A websocket that opens while window.__server is "up", and otherwise closes as a browser's does
# when the handshake fails (1006, never opened): refused (not staff) or nobody listening.
SOCKET = """
window.__server = "up";
window.WebSocket = function (url) {
  var ws = this;
  window.__socket = ws;
  window.__push = function (state) { ws.onmessage({ data: JSON.stringify({ type: "state", state: state }) }); };
  setTimeout(function () {
    if (window.__server === "up") { ws.onopen && ws.onopen(); } else { ws.onclose && ws.onclose({ code: 1006 }); }
  }, 0);
};
"""

CONN = "() => { const c = document.getElementById('conn'); return [c.dataset.status, c.textContent]; }"


@pytest.fixture
def page() -> Iterator[tuple[Any, dict[str, str]]]:
    """A page on the dashboard and the server's state for its other requests: ``up`` (the
    page), ``down`` (nothing answers), ``logged out`` (a redirect to the login page)."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    html = page_html()
    server = {"http": "up"}

    def answer(route: Any) -> None:
        if server["http"] == "down":
            route.abort("connectionrefused")
        elif server["http"] == "logged out":
            route.fulfill(status=302, headers={"Location": "/admin/login/?next=/dashboard/"}, body="")
        else:
            route.fulfill(status=200, content_type="text/html", body=html)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            pg = browser.new_page()
            pg.clock.install()
            pg.add_init_script(SOCKET)
            pg.route(URL, answer)
            pg.goto(URL)
            pg.wait_for_function("() => typeof window.__push === 'function'")
            pg.clock.run_for(100)
            pg.evaluate("(s) => window.__push(s)", {**dashboard_state({"lanes": [{"lane": 0, "state": "idle"}]}), "t": 1_800_000_000.0})
            assert pg.evaluate(CONN) == ["live", "live"]
            yield pg, server
        finally:
            browser.close()


def settled(pg: Any) -> list[str]:
    """The header once the page has found out why its last try failed."""
    pg.wait_for_function("() => /unreachable|not allowed/.test(document.getElementById('conn').textContent)", timeout=10_000)
    return list(pg.evaluate(CONN))


def test_a_server_down_for_a_while_is_not_taken_for_a_logged_out_user(page: tuple[Any, dict[str, str]]) -> None:
    """Every failed try closes with 1006 whether the server refused the handshake or is not
    there at all; after about 15 s of tries the page said "not allowed: log in as staff" while
    the server restarted (a model that takes a while to load), and the operator went to log in
    again for nothing. It now asks the page's own URL: nothing answers, so it says so."""
    pg, server = page
    server["http"] = "down"
    pg.evaluate("() => { window.__server = 'down'; window.__socket.onclose({ code: 1006 }); }")  # the server went away
    pg.clock.run_for(60_000)  # a minute of tries
    status, text = settled(pg)
    assert status == "closed" and "unreachable" in text and "not allowed" not in text
    server["http"] = "up"  # back, the session still good
    pg.evaluate("() => { window.__server = 'up'; }")
    pg.clock.run_for(11_000)
    pg.evaluate("(s) => window.__push(s)", {**dashboard_state({"lanes": []}), "t": 1_800_000_070.0})
    assert pg.evaluate(CONN) == ["live", "live"]


def test_a_session_that_ended_while_the_server_was_away_is_told_so_at_the_first_try(page: tuple[Any, dict[str, str]]) -> None:
    """The handshake is refused (the session ended meanwhile) and the page itself now redirects to
    the login: the page said "reconnecting" for its first 15 s of tries, then "not allowed"."""
    pg, server = page
    server["http"] = "logged out"
    pg.evaluate("() => { window.__server = 'refused'; window.__socket.onclose({ code: 1006 }); }")
    pg.clock.run_for(600)  # the first try after the drop
    status, text = settled(pg)
    assert status == "forbidden" and text == "not allowed: log in as staff"
