"""What the live dashboard, /slots and the admin's model page read with several models (a pool
of per-model links behind the loop's PoolLink), and the single model's queue waits: no server,
a real ModelPool whose model links are stand-ins holding jobs in flight and worker snapshots."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import RequestFactory

from dashboard.feed import full_state, models_view
from dashboard.served import pool_view, single_view
from scheduler.link import pool as pool_mod
from scheduler.link.pool import ModelPool, PoolSetup
from scheduler.link.transport import JobHandle
from scheduler.models_config import ModelsConfig, ServedModel
from superfluid_site.runtime import forget, web_runtime


def model_link(pid: int, jobs: dict[str, str | None], lanes: list[dict[str, Any]], **metrics: Any) -> Any:
    """A model's own link: the jobs this web process submitted to it (with their keys, as
    api/consumers.py sets them) and its worker's latest snapshot."""
    inflight = {job: JobHandle(job_id=job, submit=None, key=key) for job, key in jobs.items()}  # type: ignore[arg-type]
    return SimpleNamespace(inflight=inflight, connected=True, snapshot={"model": "same.gguf", "pid": pid, "lanes": lanes, "metrics": metrics, "counters": {}})


@pytest.fixture
async def pool(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ModelPool]:
    """Two loaded models, ``a`` and ``b`` (alias ``bee``; one GGUF file under two ids: their
    snapshots name the same model), each running one keyed job, and ``c``, not loaded; the loop's
    link is the pool's, as get_link makes it."""
    cfg = ModelsConfig((ServedModel("a", Path("/m/x.gguf")), ServedModel("b", Path("/m/x.gguf"), aliases=("bee",)), ServedModel("c", Path("/m/c.gguf"))))
    p = ModelPool(PoolSetup(cfg, spawn=lambda *_: None, lanes={"a": 1, "b": 1}))  # type: ignore[arg-type]
    p.loop = asyncio.get_running_loop()
    p.links["a"] = model_link(101, {"ja": "alice"}, [{"lane": 0, "state": "decode", "job_id": "ja", "class": "agent"}])
    p.links["b"] = model_link(202, {"jb": "bob"}, [{"lane": 0, "state": "prefill", "job_id": "jb", "class": "completion"}])
    p.open_links.update(p.links)  # as a load does: loaded and not yet closed
    monkeypatch.setitem(pool_mod._POOLS, -1, p)
    web_runtime().link = p.link  # not started: a PoolLink has nothing to start
    try:
        yield p
    finally:
        forget(asyncio.get_running_loop())


async def test_each_models_lanes_name_the_key_of_their_job(pool: ModelPool) -> None:
    """The keys were read from the PoolLink only, which never submits a job: every busy lane
    showed "key anonymous"."""
    assert web_runtime().in_flight_keys() == {"ja": "alice", "jb": "bob"}
    for model, key in (("a", "alice"), ("b", "bob")):
        pool.last_model = model  # the lanes panel draws the model used last
        (lane,) = full_state({})["lanes"]
        assert lane["key"] == key, model


async def test_slots_names_the_key_of_each_lane_with_several_models(pool: ModelPool) -> None:
    from api.views import slots

    for model, key in (("a", "alice"), ("b", "bob")):
        pool.last_model = model
        response = await slots.__wrapped__(RequestFactory().get("/slots"))  # type: ignore[attr-defined]
        (lane,) = json.loads(response.content)
        assert (lane["job_id"], lane["key"]) == (f"j{model}", key)


async def test_a_push_carries_each_models_counts_under_its_own_worker(pool: ModelPool) -> None:
    """The page's rates are differences between pushes; the counts it got were the model used
    last's, so each switch of model compared two workers' counters (huge tok/s, false TTFT points
    and preemptions). Each push now carries every resident model's counts, each named by its worker."""
    pool.links["a"].snapshot.update(metrics={"decode_tokens_total": 1000, "ttft_s": {"agent": {"sum": 2.0, "count": 10}}}, counters={"preemptions": 3})  # type: ignore[attr-defined]
    pool.links["b"].snapshot.update(metrics={"decode_tokens_total": 400000, "ttft_s": {"completion": {"sum": 900.0, "count": 4000}}})  # type: ignore[attr-defined]
    pushes = []
    for model in ("a", "b"):
        pool.last_model = model
        pushes.append(full_state({}))
    for push in pushes:  # the same totals whichever model the lanes panel draws
        assert [(t["label"], t["tokens"]["decode"], t["ttft"], t["counters"]) for t in push["totals"]] == [
            ("a", 1000, {"sum": 2.0, "count": 10}, {"preemptions": 3}),
            ("b", 400000, {"sum": 900.0, "count": 4000}, {}),
        ]
    sources = [t["source"] for t in pushes[0]["totals"]]
    assert len(set(sources)) == 2 and sources == [t["source"] for t in pushes[1]["totals"]]
    assert pushes[0]["tokens"]["decode"] == 1000 and pushes[1]["tokens"]["decode"] == 400000  # the lanes panel's model's own
    # a reloaded model's new worker (its counts start again at zero) is a new source
    pool.links["a"].snapshot["pid"] = 303  # type: ignore[attr-defined]
    assert full_state({})["totals"][0]["source"] not in sources


async def test_with_one_model_a_push_carries_its_one_worker() -> None:
    push = full_state({"pid": 7, "metrics": {"decode_tokens_total": 5}, "counters": {"parks": 1}})
    assert [(t["tokens"]["decode"], t["counters"], t["label"]) for t in push["totals"]] == [(5, {"parks": 1}, None)]
    assert push["totals"][0]["source"] != full_state({"pid": 8})["totals"][0]["source"]  # a restarted worker


def test_the_single_models_queue_shows_the_oldest_wait_of_each_band() -> None:
    """It was 0.0 whatever waited: the worker's snapshot has queue_oldest_wait_s_by_band."""
    link = SimpleNamespace(
        hello=SimpleNamespace(model="smol"), draining=False,
        snapshot={"lanes": [], "n_lanes": 2, "metrics": {"queue_depth_by_band": {"batch": 3, "normal": 1},
                                                         "queue_oldest_wait_s_by_band": {"interactive": 0.0, "normal": 1.25, "batch": 742.5}}},
    )
    queue = single_view(link)["queue"]
    assert queue == {"interactive": {"depth": 0, "oldest_wait_s": 0.0}, "normal": {"depth": 1, "oldest_wait_s": 1.25}, "batch": {"depth": 3, "oldest_wait_s": 742.5}}
    assert single_view(SimpleNamespace(hello=None, snapshot=None))["queue"]["batch"] == {"depth": 0, "oldest_wait_s": 0.0}  # no worker yet


async def test_a_models_lost_worker_is_not_shown_with_busy_lanes(pool: ModelPool) -> None:
    """With several models, a model whose worker went away (crashed: its supervisor is starting
    another, which loads the model again before it says hello): the dashboard's Models panel and the
    admin's Served models page showed its lost worker's last lanes as busy, as the single model's
    page and /metrics no longer do."""
    a: Any = pool.links["a"]
    a.connected = False  # a's worker crashed; b's is there
    pool.links["b"].connected = True  # type: ignore[attr-defined]
    pool.router.request_load("a")
    pool.router.schedule()
    pool.router.loaded("a")  # loaded, as the router sees it: its worker's supervisor restarts it
    rows = {m["id"]: m for m in pool_view(pool)["models"]}
    assert (rows["a"]["lanes_in_use"], rows["a"]["lane_list"]) == (0, [])
    assert rows["b"]["lanes_in_use"] == 1
    shown = {m["id"]: m for m in models_view()["models"]}
    assert shown["a"]["lanes_in_use"] == 0 and all(lane["state"] in (None, "idle") for lane in shown["a"]["lanes"])
    pool.last_model = "a"  # the lanes panel draws the model used last: not its lost worker's job
    assert all(lane.get("state") == "idle" or not lane.get("job_id") for lane in full_state({})["lanes"])


async def slots_of(query: str = "") -> tuple[int, Any]:
    from api.views import slots

    response = await slots.__wrapped__(RequestFactory().get(f"/slots{query}"))  # type: ignore[attr-defined]
    return response.status_code, json.loads(response.content)


async def test_slots_of_a_model_named_by_its_id_or_an_alias(pool: ModelPool) -> None:
    """``/slots?model=`` was ignored: asking for b's lanes (by its id or its alias) gave the
    lanes of the model used last, a's, with nothing to say they were another model's."""
    pool.last_model = "a"
    for name in ("b", "bee"):
        status, lanes = await slots_of(f"?model={name}")
        assert status == 200 and [(lane["job_id"], lane["key"]) for lane in lanes] == [("jb", "bob")], name
    status, lanes = await slots_of("?model=a")
    assert [lane["job_id"] for lane in lanes] == ["ja"]
    assert (await slots_of("?model=c")) == (200, [])  # configured, not loaded: no lanes
    assert [lane["job_id"] for lane in (await slots_of())[1]] == ["ja"]  # no model: the model used last


async def test_slots_of_an_unknown_model_is_a_404_model_not_found(pool: ModelPool) -> None:
    status, body = await slots_of("?model=nope")
    assert status == 404
    assert body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"


async def test_slots_shows_no_busy_lane_of_a_models_lost_worker(pool: ModelPool) -> None:
    """A model's worker crashed (its supervisor restarting it): /slots went on showing its last
    lanes busy with their jobs, where the dashboard and /metrics show them idle."""
    pool.links["a"].connected = False  # type: ignore[attr-defined]
    pool.last_model = "a"
    for query in ("", "?model=a"):
        status, lanes = await slots_of(query)
        assert status == 200 and [(lane["id"], lane["state"], lane["is_processing"], lane["job_id"]) for lane in lanes] == [(0, "idle", False, None)], query
    assert [lane["job_id"] for lane in (await slots_of("?model=b"))[1]] == ["jb"]


async def test_slots_of_the_single_models_lost_worker_shows_its_lanes_idle() -> None:
    from superfluid_site.runtime import web_runtime

    link: Any = SimpleNamespace(
        connected=True, inflight={},
        snapshot={"lane_ctx": 512, "lanes": [{"lane": 0, "state": "decode", "job_id": "j1", "generated": 5}, {"lane": 1, "state": "idle"}]},
    )
    web_runtime().link = link
    try:
        assert [lane["is_processing"] for lane in (await slots_of())[1]] == [True, False]
        link.connected = False  # the worker crashed; serve's supervisor restarts it
        status, lanes = await slots_of()
        assert status == 200 and [(lane["state"], lane["is_processing"], lane["job_id"], lane["n_ctx"]) for lane in lanes] == [("idle", False, None, 512)] * 2
    finally:
        forget(asyncio.get_running_loop())


@pytest.mark.parametrize("listed", [(), ("b",), ("bee",)])
async def test_the_model_list_gives_each_alias_as_its_model_for_what_the_key_may_use(pool: ModelPool, monkeypatch: pytest.MonkeyPatch, listed: tuple[str, ...]) -> None:
    """``/v1/models`` with several models: every id and alias, an alias with ``alias_of`` and its
    model's state; a key limited to a model by one of its names sees it by all of them."""
    from api import views

    monkeypatch.setattr(views, "get_pool", lambda: pool)
    monkeypatch.setattr(pool_mod, "get_pool", lambda: pool)  # model_allowed resolves names through it
    pool.router.request_load("b")
    pool.router.schedule()
    pool.router.loaded("b")
    request = RequestFactory().get("/v1/models")
    request.principal = SimpleNamespace(policy=SimpleNamespace(allowed_models=listed, allows_model=lambda m: not listed or m in listed))  # type: ignore[attr-defined]
    listing = json.loads((await views.models.__wrapped__(request)).content)["data"]  # type: ignore[attr-defined]
    shown = {m["id"]: (m["state"], m.get("alias_of")) for m in listing}
    both = {"b": ("loaded", None), "bee": ("loaded", "b")}
    assert shown == (both if listed else {"a": ("unloaded", None), **both, "c": ("unloaded", None)})
