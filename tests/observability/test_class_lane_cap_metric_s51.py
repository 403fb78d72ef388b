"""Why did a request wait with lanes idle? Its class was at its class-lane cap. /metrics now says
so: ``superfluid_class_lane_cap{class}`` is the cap in force (the admin's, sent to the worker as
a ``config`` op), every lane for a class without one. Before, /metrics had the class's busy
lanes and its queue but not its cap, so a wait on the cap read as a wait for a lane."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import api.metrics as metrics_module
from api.metrics import SuperfluidCollector, WebMetrics, exposition
from scheduler.core.qos import QosClass
from scheduler.link.messages import Config
from tests.observability.test_worker_metrics import FakeConn, make_worker, submit


def scraped(snapshot: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The families /metrics renders from the worker's snapshot, parsed back: name -> {class: value}."""
    registry = CollectorRegistry()
    registry.register(SuperfluidCollector(lambda: (snapshot, True, 0, 0)))
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(exposition(registry=registry)):
        for s in fam.samples:
            if "class" in s.labels:
                out.setdefault(s.name, {})[s.labels["class"]] = s.value
    return out


def test_a_class_waiting_on_its_cap_with_lanes_idle_shows_the_cap_it_is_at(monkeypatch: Any) -> None:
    monkeypatch.setattr(metrics_module, "web_metrics", WebMetrics())
    worker, _clock = make_worker(max_batch=4)
    worker.configure(Config(class_lanes={"background": 1}))  # what the admin's cap sends
    conn = FakeConn()
    for job in ("b1", "b2", "b3"):
        submit(worker, conn, job, qos=QosClass.BACKGROUND, priority=-100, max_tokens=50)
    worker.run_tick()
    snapshot = worker.snapshot()
    assert snapshot["metrics"]["lanes_by_state"]["idle"] == 3
    m = scraped(snapshot)
    assert m["superfluid_lanes_by_class"]["background"] == 1 and m["superfluid_queue_depth"]["background"] == 2
    # the class is at its cap: that, not the lanes (three of four idle), is why b2 and b3 wait
    assert m["superfluid_class_lane_cap"] == {"interactive": 4, "completion": 4, "agent": 4, "background": 1}

    worker.configure(Config(class_lanes={}))  # the admin deleted the cap: every lane again
    assert scraped(worker.snapshot())["superfluid_class_lane_cap"]["background"] == 4


def test_a_fleets_cap_is_the_fleets_and_odd_values_never_break_the_scrape(monkeypatch: Any) -> None:
    monkeypatch.setattr(metrics_module, "web_metrics", WebMetrics())
    fleet = {"metrics": {"lanes_total": 8}, "class_lanes": {"background": 3, "agent": "x", "interactive": 99}, "fleet": [], "global_queue": {}}
    assert scraped(fleet)["superfluid_class_lane_cap"] == {"interactive": 8, "completion": 8, "agent": 8, "background": 3}
    assert scraped({"metrics": {"lanes_total": 2}, "class_lanes": None})["superfluid_class_lane_cap"]["agent"] == 2
