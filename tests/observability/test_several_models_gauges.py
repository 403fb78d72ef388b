"""/metrics and the served-models page with several models while one model's worker is away
(crashed, its supervisor restarting it) and once a model is unloaded (a swap, its TTL): no
figure of a worker that is gone may be reported as the server's present state."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import api.metrics as metrics_module
from api.metrics import SuperfluidCollector, WebMetrics, exposition
from dashboard.served import pool_view
from scheduler.link.messages import Snapshot
from scheduler.link.pool import ModelPool, PoolSetup
from scheduler.models_config import ModelsConfig, ServedModel
from tests.link.test_pool_failures import Startable
from tests.link.test_pool_lifecycle import Proc, until, used_once

from .snapshots import busy_worker

# a worker with its lane decoding, three requests queued at it and most of its KV pool in use
BUSY = busy_worker(
    "m",
    1,
    queues={"queue_depth_by_band": {"normal": 3}, "queue_oldest_wait_s_by_band": {"normal": 42.0}},
    admitted=7,
    pid=11,
)


def pool_of(worker: Any = Startable, max_loaded: int = 2) -> ModelPool:
    cfg = ModelsConfig((ServedModel("a", Path("/m/a.gguf")), ServedModel("b", Path("/m/b.gguf"))), max_loaded_models=max_loaded)
    return ModelPool(PoolSetup(cfg, spawn=lambda _m, _s: worker(), lanes={"a": 1, "b": 1}, ctx_sizes={"a": 512, "b": 512}))  # type: ignore[arg-type]


def scrape(monkeypatch: pytest.MonkeyPatch, pool: ModelPool) -> tuple[str, dict[str, Any]]:
    monkeypatch.setattr(metrics_module, "web_metrics", WebMetrics())
    registry = CollectorRegistry()
    registry.register(SuperfluidCollector(lambda: (pool.link.snapshot, True, 0, 0), pool.router_stats))
    text = exposition(registry=registry)
    return text, {f.name: f for f in text_string_to_metric_families(text)}


def by_label(fams: dict[str, Any], name: str, label: str) -> dict[str, float]:
    return {s.labels[label]: s.value for s in fams[name].samples} if name in fams else {}


def no_duplicate_samples(text: str) -> None:
    samples = [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert len(samples) == len(set(samples)), sorted({s for s in samples if samples.count(s) > 1})


async def test_a_restarting_models_lost_worker_queue_is_not_in_the_routers_queue_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    """llamaswap_scheduler_queue_depth adds what waits at each resident model's worker to the
    router's queue: a model whose worker crashed (its supervisor starting another) went on
    adding its lost worker's last queue (3 normal requests, 42 s old) for as long as the restart
    took, while its own worker families were already gone from /metrics."""
    pool = pool_of()
    try:
        await used_once(pool, "a")
        await used_once(pool, "b")
        for model in ("a", "b"):
            pool.links[model]._on_message(Snapshot({**BUSY, "pid": 11 if model == "a" else 22}))
        text, fams = scrape(monkeypatch, pool)
        assert by_label(fams, "llamaswap_scheduler_queue_depth", "band")["normal"] == 6
        pool.links["a"]._on_lost(0.0)  # a's worker crashed; b's is there
        text, fams = scrape(monkeypatch, pool)
        no_duplicate_samples(text)
        assert by_label(fams, "superfluid_worker_connected", "model") == {"a": 0, "b": 1}
        assert by_label(fams, "superfluid_lanes_active", "model") == {"b": 1}  # a's families are gone
        assert by_label(fams, "llamaswap_scheduler_queue_depth", "band")["normal"] == 3  # b's only
        assert by_label(fams, "superfluid_model_state", "model")  # the router's families are still there
        # the served-models page renders the model as it is: loaded at the router, nothing in use
        rows = {m["id"]: m for m in pool_view(pool)["models"]}
        assert (rows["a"]["lanes_in_use"], rows["b"]["lanes_in_use"]) == (0, 1)
    finally:
        pool.kill()


@pytest.mark.parametrize("how", ["swap", "ttl"])
async def test_an_unloaded_models_gauges_leave_and_its_state_says_unloaded(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """A model unloaded by a swap (the serial router making room for another) or by its TTL:
    its worker may take a while to exit, and meanwhile nothing of it is reported as resident."""
    clock = [0.0]
    cfg = ModelsConfig((ServedModel("a", Path("/m/a.gguf"), ttl_s=5.0), ServedModel("b", Path("/m/b.gguf"))))
    pool = ModelPool(PoolSetup(cfg, spawn=lambda _m, _s: Proc(), lanes={"a": 1, "b": 1}, ctx_sizes={"a": 512, "b": 512}), clock=lambda: clock[0])  # type: ignore[arg-type]
    pool.start()
    for_b = None
    try:
        await used_once(pool, "a")
        pool.links["a"]._on_message(Snapshot(dict(BUSY)))
        _text, fams = scrape(monkeypatch, pool)
        assert by_label(fams, "superfluid_lanes_active", "model") == {"a": 1}
        if how == "swap":
            for_b = asyncio.ensure_future(pool.acquire("b", 0))  # one slot: a makes room for b
        else:
            clock[0] += 10.0  # a's TTL passes: the router's tick unloads it
        await until(lambda: "a" not in pool.links, "a being unloaded")
        text, fams = scrape(monkeypatch, pool)  # its worker (slow to exit) still runs
        no_duplicate_samples(text)
        assert "a" not in by_label(fams, "superfluid_lanes_active", "model")
        assert "a" not in by_label(fams, "superfluid_pool_blocks_used", "model")
        # what waits: b's request at the router in a swap, nothing after a TTL; never a's worker's
        assert by_label(fams, "llamaswap_scheduler_queue_depth", "band")["normal"] == (1 if how == "swap" else 0)
        shown = {s.labels["model"]: s.labels["state"] for s in fams["superfluid_model_state"].samples if s.value == 1}
        assert shown["a"] == "unloaded"
        rows = {m["id"]: m for m in pool_view(pool)["models"]}
        assert (rows["a"]["state"], rows["a"]["resident"], rows["a"]["lanes_in_use"]) == ("unloaded", False, 0)
    finally:
        if for_b is not None:
            for_b.cancel()
        pool.kill()
        if pool._ticker is not None:
            pool._ticker.cancel()


@pytest.mark.django_db
def test_the_served_models_page_renders_a_model_whose_worker_is_restarting(admin_client: Any) -> None:
    """The admin's page while a's worker is away (its supervisor restarting it): it renders,
    a's lanes are not shown in use, b's are."""
    from scheduler.link import pool as pool_mod
    from scheduler.link.client import SocketTransport

    pool = pool_of()
    for model in ("a", "b"):
        pool.router.request_load(model)
        pool.router.schedule()
        pool.router.loaded(model)
        link = SocketTransport("/nonexistent.sock")
        link._connected.set()
        link._on_message(Snapshot(dict(BUSY)))
        pool.links[model] = link
    pool.links["a"]._on_lost(0.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(pool_mod._POOLS, -1, pool)
        html = admin_client.get("/admin/dashboard/servedmodel/").content.decode()
    rows = dict(re.findall(r'<tr class="model" data-model="(\w)">.*?<td class="lanes">(.*?)</td>', html, re.S))
    assert rows == {"a": "0 / 1", "b": "1 / 1"}


async def test_the_internal_models_list_shows_no_lane_in_use_of_a_models_lost_worker() -> None:
    """``GET /v1/internal/models`` (the pool's models_state) counted a crashed worker's last
    busy lanes as in use for as long as its restart took; the admin's page already did not."""
    pool = pool_of()
    try:
        await used_once(pool, "a")
        await used_once(pool, "b")
        for model in ("a", "b"):
            pool.links[model]._on_message(Snapshot(dict(BUSY)))
        pool.links["a"]._on_lost(0.0)
        rows = {m["id"]: m for m in pool.models_state()}
        assert (rows["a"]["lanes_in_use"], rows["b"]["lanes_in_use"]) == (0, 1)
    finally:
        pool.kill()
