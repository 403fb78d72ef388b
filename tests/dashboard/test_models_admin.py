"""The admin's "Served models" page: each model of the running server, read-only, admins only."""

from __future__ import annotations

import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from scheduler.link import pool as pool_mod
from scheduler.link.pool import ModelPool, PoolSetup
from scheduler.models_config import ModelsConfig, ServedModel
from superfluid_site import runtime as runtime_mod

URL = "/admin/dashboard/servedmodel/"


def cells(html: str, model: str) -> dict[str, str]:
    row = re.search(rf'<tr class="model" data-model="{re.escape(model)}">(.*?)</tr>', html, re.S)
    assert row, f"no row for {model}"
    return {k: re.sub(r"\s+", " ", v).strip() for k, v in re.findall(r'<td class="([\w-]+)">(.*?)</td>', row.group(1), re.S)}


def band_depth(html: str, band: str) -> int:
    m = re.search(rf'<tr data-band="{band}">.*?<td class="depth">(\d+)</td>', html, re.S)
    assert m
    return int(m.group(1))


@pytest.fixture
def two_models(monkeypatch: pytest.MonkeyPatch) -> ModelPool:
    cfg = ModelsConfig((ServedModel("a", Path("/m/a.gguf"), aliases=("alpha",)), ServedModel("b", Path("/m/b.gguf"), ttl_s=300), ServedModel("f", Path("/m/f.gguf"), fim=True)))
    pool = ModelPool(PoolSetup(cfg, spawn=lambda *_: None, lanes={"a": 2, "b": 1, "f": 2}, ctx_sizes={"a": 1024, "b": 1024, "f": 512}))  # type: ignore[arg-type]
    r = pool.router
    r.request_load("a")
    r.schedule()
    r.loaded("a")
    r.submit("x1", "a", 0)
    r.schedule()  # runs on a
    r.submit("x2", "b", -100)  # a batch request waits for b (one slot, a is busy)
    r.submit("x3", "b", 0)
    r.schedule()
    pool.last_used["a"] = 1_800_000_000.0  # as acquire() notes it
    pool.links["a"] = SimpleNamespace(snapshot={"lanes": [{"state": "decode"}, {"state": "idle"}]})  # type: ignore[assignment]
    monkeypatch.setitem(pool_mod._POOLS, -1, pool)
    return pool


@pytest.mark.django_db
def test_only_admins_see_the_page(client: Client, two_models: ModelPool) -> None:
    r = client.get(URL)
    assert r.status_code == 302 and r["Location"].startswith("/admin/login/")
    staff = get_user_model().objects.create_user("sam", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get(URL).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_servedmodel"))
    assert client.get(URL).status_code == 200


@pytest.mark.django_db
def test_each_model_shows_residence_lanes_queue_by_band_last_use_and_ttl(admin_client: Client, two_models: ModelPool) -> None:
    index = admin_client.get("/admin/").content.decode()
    assert URL in index and "Served models" in index
    html = admin_client.get(URL).content.decode()
    a, b, f = cells(html, "a"), cells(html, "b"), cells(html, "f")
    assert (a["state"], a["resident"], a["lanes"], a["running"], a["requests"], a["ttl"]) == ("draining", "yes", "1 / 2", "1", "1", "never")
    assert a["last-used"] == time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(1_800_000_000))
    assert (b["state"], b["resident"], b["lanes"], b["queue"], b["ttl"], b["last-used"]) == ("unloaded", "no", "0 / 1", "0 / 1 / 1", "300 s", "never")
    assert (f["state"], f["resident"]) == ("unloaded", "no") and "f (FIM)" in html
    assert (band_depth(html, "interactive"), band_depth(html, "normal"), band_depth(html, "batch")) == (0, 1, 1)
    assert "at most 1 model loaded at once" in html


@pytest.mark.django_db
def test_the_single_worker_server_shows_its_one_model(admin_client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    link: Any = SimpleNamespace(
        hello=SimpleNamespace(model="smol"), draining=False,
        snapshot={"n_lanes": 2, "lane_ctx": 4096, "lanes": [{"state": "prefill"}, {"state": "idle"}],
                  "metrics": {"queue_depth_by_band": {"interactive": 0, "normal": 3, "batch": 0}}},
    )
    monkeypatch.setattr(runtime_mod, "all_runtimes", lambda: [SimpleNamespace(link=link)])  # the server's one web runtime
    html = admin_client.get(URL).content.decode()
    smol = cells(html, "smol")
    assert (smol["state"], smol["resident"], smol["lanes"], smol["queue"], smol["ttl"]) == ("loaded", "yes", "1 / 2", "0 / 3 / 0", "never")
    assert "One model, no router" in html and band_depth(html, "normal") == 3
    # and it sends the operator to no load or unload route: the single-worker server has none (404)
    assert "/v1/internal/models" not in html and "at the router" not in html


@pytest.mark.django_db
def test_the_single_workers_model_is_not_shown_loaded_while_its_worker_is_away(admin_client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """The link keeps the hello of the worker it last talked to: with that worker gone (crashed,
    restarting, loading its model again) the page said "loaded", resident, for as long as it was away."""
    link: Any = SimpleNamespace(hello=SimpleNamespace(model="smol"), draining=False, connected=True, snapshot={"n_lanes": 2, "lanes": [{"state": "idle"}, {"state": "idle"}]})
    monkeypatch.setattr(runtime_mod, "all_runtimes", lambda: [SimpleNamespace(link=link)])
    smol = cells(admin_client.get(URL).content.decode(), "smol")
    assert (smol["state"], smol["resident"]) == ("loaded", "yes")
    link.connected = False  # the worker went away
    smol = cells(admin_client.get(URL).content.decode(), "smol")
    assert (smol["state"], smol["resident"]) == ("unloaded", "no")


# -- the live dashboard's push: every resident model's lanes, the router's queue by band ----------


async def test_a_push_carries_every_resident_models_lanes_and_the_router_queue(two_models: ModelPool) -> None:
    import asyncio

    from dashboard.feed import full_state, models_view

    assert models_view() == {}  # no pool on this loop (the single-worker server): nothing extra
    two_models.loop = asyncio.get_running_loop()
    two_models.links["a"].snapshot["lanes"] = [{"lane": 0, "state": "decode", "class": "agent", "job_id": "j"}, {"lane": 1, "state": "idle"}]  # type: ignore[index]
    pushed = full_state({"model": "a", "lanes": []})
    assert [(m["id"], m["state"], m["n_lanes"], m["lanes_in_use"]) for m in pushed["models"]] == [("a", "draining", 2, 1)]  # b and f are not resident
    assert pushed["models"][0]["lanes"] == [{"lane": 0, "state": "decode", "class": "agent"}, {"lane": 1, "state": "idle", "class": None}]
    assert {b: q["depth"] for b, q in pushed["router_queue"].items()} == {"interactive": 0, "normal": 1, "batch": 1}
    assert pushed["model"] == "a"  # the snapshot's own view is still there
    # the lanes panel draws the model used last, whichever worker's snapshot came in
    two_models.last_model = "a"
    two_models.links["a"].snapshot["model"] = "a"  # type: ignore[index]
    assert full_state({"model": "f", "lanes": []})["model"] == "a"


# -- load and unload from the page -------------------------------------------------------------


def csrf_post(client: Client, url: str) -> Any:
    """A POST as the page's form sends it: the CSRF token of the list page it was on."""
    page = client.get(URL)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert token, "the page has no form"
    return client.post(url, {"csrfmiddlewaretoken": token.group(1)})


@pytest.fixture
def no_spawn(two_models: ModelPool, monkeypatch: pytest.MonkeyPatch) -> ModelPool:
    """The pool's router takes the request; no worker process is started here."""
    monkeypatch.setattr(two_models, "kick", lambda: None)
    return two_models


def logged(model: str) -> list[str]:
    from django.contrib.admin.models import LogEntry

    return [e.get_change_message() for e in LogEntry.objects.filter(object_id=model).order_by("action_time")]


@pytest.mark.django_db
def test_a_superuser_loads_and_unloads_from_the_page_and_each_is_in_the_models_history(no_spawn: ModelPool) -> None:
    admin_user = get_user_model().objects.create_superuser("root", password="pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    html = client.get(URL).content.decode()
    # b is not resident: a Load button; a is: Unload
    assert f'action="{URL}b/load/"' in html and f'action="{URL}a/unload/"' in html
    r = csrf_post(client, URL + "b/load/")
    assert r.status_code == 302 and r["Location"] == URL
    assert "b" in no_spawn.router.admin_loads
    r = csrf_post(client, URL + "alpha/unload/")  # by alias
    assert r.status_code == 302 and no_spawn.router.models["a"].unload_requested
    assert logged("b") == ["Asked the router to load the model."]
    assert logged("a") == ["Asked the router to unload the model."]
    page = client.get(URL).content.decode()
    assert "The router will unload a once its admitted work has finished." in page
    history = client.get(URL + "b/history/")
    assert history.status_code == 200 and "Asked the router to load the model." in history.content.decode()
    recent = re.search(r'<ul class="actionlist">(.*?)</ul>', client.get("/admin/").content.decode(), re.S)
    assert recent and f"{URL}a/change/" in recent.group(1) and f"{URL}b/change/" in recent.group(1)  # recent actions
    assert client.get(URL + "b/change/").status_code == 200  # where they link: the model's id, read-only


@pytest.mark.django_db
def test_an_action_needs_a_post_with_the_csrf_token_and_the_permission(no_spawn: ModelPool) -> None:
    staff = get_user_model().objects.create_user("sam", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_servedmodel"))
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    assert 'class="load"' not in client.get(URL).content.decode()  # no buttons for a viewer
    assert client.post(URL + "b/load/").status_code == 403  # no CSRF token
    assert csrf_post(client, URL + "b/load/").status_code == 403  # no permission
    assert client.get(URL + "b/load/").status_code == 405
    assert not no_spawn.router.admin_loads and logged("b") == []

    staff.user_permissions.add(Permission.objects.get(codename="manage_servedmodel"))
    staff = get_user_model().objects.get(pk=staff.pk)  # permissions are cached on the instance
    client.force_login(staff)
    assert csrf_post(client, URL + "b/load/").status_code == 302
    assert "b" in no_spawn.router.admin_loads and len(logged("b")) == 1

    anonymous = Client()
    r = anonymous.post(URL + "a/unload/")
    assert r.status_code == 302 and r["Location"].startswith("/admin/login/")
    assert not no_spawn.router.models["a"].unload_requested


@pytest.mark.django_db
def test_an_unknown_model_or_a_server_without_router_is_told_and_nothing_is_logged(admin_client: Client, no_spawn: ModelPool, monkeypatch: pytest.MonkeyPatch) -> None:
    r = admin_client.post(URL + "gamma/load/", follow=True)
    assert "No model &#x27;gamma&#x27; is configured." in r.content.decode()
    assert not no_spawn.router.admin_loads and logged("gamma") == []
    monkeypatch.delitem(pool_mod._POOLS, -1)
    r = admin_client.post(URL + "a/unload/", follow=True)
    assert "serves one model without a router" in r.content.decode() and logged("a") == []
