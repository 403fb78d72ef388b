"""Observability after a worker goes away: /metrics and the served-models page must not go on
reporting the lost worker's busy lanes, queues and KV pool as the server's present state."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import api.metrics as metrics_module
from api.metrics import SuperfluidCollector, WebMetrics, exposition
from scheduler.link.client import SocketTransport
from scheduler.link.messages import Snapshot
from superfluid_site import runtime as runtime_mod

from .snapshots import busy_worker

# a worker with both lanes decoding, three agents queued and most of its KV pool in use
BUSY = busy_worker(
    "smol",
    2,
    queues={
        "queue_depth_by_class": {"agent": 3},
        "queue_oldest_wait_s_by_class": {"agent": 12.0},
        "queue_depth_by_band": {"normal": 3},
    },
    admitted=40,
)


def parse(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def values(fams: dict[str, Any], name: str) -> list[float]:
    return [s.value for s in fams[name].samples] if name in fams else []


def scrape(monkeypatch: pytest.MonkeyPatch, link: Any = None, router: Any = None) -> dict[str, Any]:
    monkeypatch.setattr(metrics_module, "web_metrics", WebMetrics())
    registry = CollectorRegistry()
    registry.register(SuperfluidCollector(link or (lambda: None), router or (lambda: None)))
    return parse(exposition(registry=registry))


def lost_link() -> SocketTransport:
    """A link that had the busy worker's snapshot, then lost the worker (it crashed; serve's
    supervisor is starting another, which loads its model before it says hello)."""
    link = SocketTransport("/nonexistent.sock")
    link._connected.set()
    link._on_message(Snapshot(dict(BUSY)))
    link._on_lost(0.0)
    return link


def test_after_the_worker_is_lost_metrics_do_not_report_its_busy_lanes_queue_and_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    link = lost_link()
    assert not link.connected and link.snapshot  # the link keeps the lost worker's last snapshot
    fams = scrape(monkeypatch, lambda: (link.snapshot, link.connected, link.worker_restarts, link.requests_in_flight()))
    assert values(fams, "superfluid_worker_connected") == [0]
    # what a dead worker last said is not the server's state: no busy lanes, no queue, no pool
    assert sum(values(fams, "superfluid_lanes_active")) == 0
    assert sum(values(fams, "superfluid_queue_depth")) == 0
    assert sum(values(fams, "llamaswap_scheduler_queue_depth")) == 0
    assert sum(values(fams, "superfluid_queue_oldest_wait_seconds")) == 0
    assert sum(values(fams, "superfluid_pool_blocks_used")) == 0


def test_while_connected_the_workers_snapshot_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    fams = scrape(monkeypatch, lambda: (dict(BUSY), True, 0, 2))
    assert values(fams, "superfluid_lanes_active") == [2]
    assert sum(values(fams, "superfluid_queue_depth")) == 3


def test_a_redis_fleet_with_no_worker_left_still_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = {"model": "smol", "n_lanes": 0, "lanes": [], "fleet": [], "global_queue": {"agent": 4}}
    fams = scrape(monkeypatch, lambda: (gone, False, 0, 0))
    assert values(fams, "superfluid_fleet_workers") == [0]
    assert {s.labels["class"]: s.value for s in fams["superfluid_global_queue_depth"].samples} == {"agent": 4}


def test_with_several_models_a_crashed_models_worker_is_not_reported_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    router = {
        "snapshots": {"a": dict(BUSY), "b": dict(BUSY)},
        # a's worker crashed: its supervisor restarts it (loading the model again); b's is there
        "links": {"a": {"connected": False, "restarts": 0, "inflight": 0}, "b": {"connected": True, "restarts": 0, "inflight": 2}},
        "states": {"a": "loaded", "b": "loaded"},
    }
    fams = scrape(monkeypatch, lambda: (None, True, 0, 0), lambda: router)
    assert {s.labels["model"]: s.value for s in fams["superfluid_lanes_active"].samples} == {"b": 2}
    assert {s.labels["model"]: s.value for s in fams["superfluid_worker_connected"].samples} == {"a": 0, "b": 1}


@pytest.mark.django_db
def test_the_single_workers_model_page_shows_no_lanes_in_use_while_its_worker_is_away(admin_client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page said the model was unloaded, and in the same row that both its lanes were in
    use and three requests waited for it: the lost worker's last snapshot."""
    from dashboard.served import served_state

    link: Any = SimpleNamespace(hello=SimpleNamespace(model="smol"), draining=False, connected=True, snapshot=dict(BUSY))
    monkeypatch.setattr(runtime_mod, "all_runtimes", lambda: [SimpleNamespace(link=link)])
    row = served_state()["models"][0]
    assert (row["state"], row["lanes_in_use"], row["waiting"]) == ("loaded", 2, 3)
    link.connected = False  # the worker went away
    state = served_state()
    row = state["models"][0]
    assert (row["state"], row["resident"]) == ("unloaded", False)
    assert (row["lanes_in_use"], row["running"], row["waiting"], row["lane_list"]) == (0, 0, 0, [])
    assert sum(b["depth"] for b in state["queue"].values()) == 0
    assert admin_client.get("/admin/dashboard/servedmodel/").status_code == 200
