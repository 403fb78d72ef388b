"""Key names (free text an admin types), model ids and fleet hosts reach the dashboard page in
every push. Whatever they hold (markup, script, quotes, a selector's metacharacters, newlines),
the page must show them as text: no element of theirs, no script run, and the very text shown.
The page's own script in headless chromium with the stand-in socket (tests/dashboard/test_page.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dashboard.feed import dashboard_state

from .test_page import fake_page, fresh

MARKUP = ['<img src=x onerror="window.__pwned=1">', "<script>window.__pwned=1</script>", '"><svg onload=window.__pwned=1>',
          "'];window.__pwned=1;//", "\\\"]\n[data-x=", "</td></tr><tr><td>", "ünï — 🙂"]
HOSTILE = st.lists(st.sampled_from(MARKUP) | st.text(max_size=12), min_size=1, max_size=3).map("".join).filter(bool)

# Every element of the page as it is before any push, to tell an injected one apart.
ELEMENTS = "() => document.querySelectorAll('body *').length"
SHOWN = """() => ({
  lanes: Array.from(document.querySelectorAll('#lanes .cls')).map((e) => e.textContent),
  ids: Array.from(document.querySelectorAll('#lanes .id')).map((e) => e.textContent),
  model: document.getElementById('model').textContent,
  fleet: Array.from(document.querySelectorAll('#fleet td:first-child')).map((e) => e.textContent),
  parked: document.getElementById('parked').textContent,
  models: Array.from(document.querySelectorAll('#models .name')).map((e) => e.textContent),
  foreign: document.querySelectorAll('body img, body svg, body script:not([data-own]), body iframe').length,
  pwned: window.__pwned === 1,
})"""


@pytest.fixture(scope="module")
def page() -> Iterator[Any]:
    with fake_page() as pg:
        yield pg


def state_of(name: str) -> dict[str, Any]:
    lanes = [{"lane": 0, "state": "decode", "job_id": "j0", "class": "agent", "key": name, "host": name, "generated": 3},
             {"lane": 1, "state": "prefill", "job_id": name, "class": "background", "prompt_tokens": 10, "prompt_done": 4}]
    snapshot = {"model": name, "engine": name, "n_lanes": 2, "lanes": lanes,
                "parked": [{"job_id": name, "class": "agent", "tokens": 5}],
                "fleet": [{"worker": f"{name}:4242:a1b2c3", "host": name, "n_lanes": 2, "model": "other", "lanes": lanes}], "global_queue": {}}
    return {**dashboard_state(snapshot, {"j1": name}), "t": 1_800_000_000.0,
            "models": [{"id": name, "state": "loaded", "n_lanes": 2, "lanes_in_use": 1, "waiting": 0, "lanes": [{"lane": 0, "state": "decode", "class": name}]}],
            "router_queue": {}}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=HOSTILE)
@example(name="\x00")  # a selector built with CSS.escape found no card for it: one more each push
@example(name=MARKUP[0] + MARKUP[2])
@example(name=":")  # the worker id's pid was read as its second field: none shown
def test_any_key_model_or_host_name_is_shown_as_text(page: Any, name: str) -> None:
    pg = fresh(page)
    pg.evaluate("() => document.querySelectorAll('script').forEach((s) => s.setAttribute('data-own', ''))")
    pg.evaluate("(s) => window.__push(s)", state_of(name))
    shown = pg.evaluate(SHOWN)
    assert not shown["pwned"] and shown["foreign"] == 0, shown
    assert shown["lanes"][0] == f"agent · key {name}"
    assert shown["ids"][0] == f"lane 0 · {name}"
    assert shown["model"].startswith(f"{name} · {name} · 2 lanes")
    assert shown["fleet"] == [f"{name} · 4242 · other"]  # host · pid (of the worker id host:pid:tag)
    assert shown["parked"].startswith("agent · ") and shown["parked"].endswith(" · 5 tokens")  # a job id's first 8 UTF-16 units
    assert shown["models"] == [name]
    # a second push finds the model's card by its id and keeps it
    pg.evaluate("(s) => window.__push(s)", {**state_of(name), "t": 1_800_000_000.2})
    assert pg.evaluate(SHOWN)["models"] == [name]
