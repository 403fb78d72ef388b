"""/metrics stays valid Prometheus text with model ids and fleet hosts that hold quotes,
backslashes, newlines and non-ASCII: each parses back to the very same label value."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import api.metrics as metrics_module
from api.metrics import SuperfluidCollector, WebMetrics, exposition

HOSTILE = ['a"b', "back\\slash", "new\nline", "ünï—код", 'x"} 1\nfake_metric 9']


def test_hostile_model_ids_and_hosts_round_trip(monkeypatch: Any) -> None:
    monkeypatch.setattr(metrics_module, "web_metrics", WebMetrics())
    snapshots = {m: {"metrics": {"lanes_total": 2}, "counters": {"ticks": 3}} for m in HOSTILE}
    router = {
        "snapshots": snapshots,
        "links": {m: {"connected": True, "restarts": 1, "inflight": 0} for m in HOSTILE},
        "loads": {m: 1 for m in HOSTILE},
        "states": {m: "loaded" for m in HOSTILE},
    }
    fleet_snapshot = {"metrics": {}, "fleet": [{"worker": w, "host": w, "n_lanes": 2, "lanes": []} for w in HOSTILE], "global_queue": {}}
    for link, rtr in (((lambda: (None, True, 0, 0)), (lambda: router)), ((lambda: (fleet_snapshot, True, 0, 0)), (lambda: None))):
        registry = CollectorRegistry()
        registry.register(SuperfluidCollector(link, rtr))
        families = {f.name: f for f in text_string_to_metric_families(exposition(registry=registry))}
        assert "fake_metric" not in families
        if "superfluid_model_loads" in families:
            assert {s.labels["model"] for s in families["superfluid_ticks"].samples if s.name == "superfluid_ticks_total"} == set(HOSTILE)
            assert {s.labels["model"] for s in families["superfluid_model_loads"].samples if s.name.endswith("_total")} == set(HOSTILE)
        else:
            assert {s.labels["host"] for s in families["superfluid_fleet_lanes"].samples} == set(HOSTILE)
