"""/metrics rendering: valid Prometheus text, web-side per-key counters and who sees them."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import api.metrics as metrics_module
from api.metrics import SuperfluidCollector, WebMetrics, exposition
from api.records import RequestRecord
from scheduler.worker.metrics import Histogram


def parse(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def registry_with(web: WebMetrics, snapshot: dict[str, Any] | None = None, monkeypatch: Any = None) -> CollectorRegistry:
    """A registry holding only superfluid's collector, over ``web`` and one worker snapshot."""
    monkeypatch.setattr(metrics_module, "web_metrics", web)
    registry = CollectorRegistry()
    registry.register(SuperfluidCollector(lambda: (snapshot, True, 2, 0)))
    return registry


def test_a_snapshot_renders_as_text_that_prometheus_parses_with_help_type_and_histogram_series(monkeypatch: Any) -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.5, 3.0):
        h.observe(v)
    snapshot = {
        "metrics": {"lanes_total": 4, "lanes_by_state": {"idle": 1, "decode": 3}, "queue_depth_by_class": {"agent": 2}, "ttft_s": {"agent": h.stats()}},
        "counters": {"dispatched_batch": 5, "preemptions": 1},
    }
    text = exposition(registry=registry_with(WebMetrics(), snapshot, monkeypatch))
    assert "# TYPE superfluid_ttft_seconds histogram" in text and "# TYPE llamaswap_scheduler_dispatched_total counter" in text
    assert "# HELP superfluid_lanes_active Lanes holding a job." in text
    parsed = parse(text)
    assert [s.value for s in parsed["superfluid_lanes_active"].samples] == [3]
    depth = {s.labels["class"]: s.value for s in parsed["superfluid_queue_depth"].samples}
    assert depth == {"interactive": 0, "completion": 0, "agent": 2, "background": 0}  # every class, 0 when idle
    assert {s.labels["band"]: s.value for s in parsed["llamaswap_scheduler_dispatched"].samples} == {"interactive": 0, "normal": 0, "batch": 5}
    buckets = [s for s in parsed["superfluid_ttft_seconds"].samples if s.name == "superfluid_ttft_seconds_bucket"]
    assert [(s.labels["le"], s.value) for s in buckets] == [("0.1", 1), ("1.0", 2), ("+Inf", 3)]
    assert [s.value for s in parsed["superfluid_ttft_seconds"].samples if s.name == "superfluid_ttft_seconds_count"] == [3]
    assert [s.value for s in parsed["superfluid_worker_restarts"].samples] == [2]
    assert [s.value for s in parsed["superfluid_worker_connected"].samples] == [1]


def test_before_the_first_snapshot_only_the_link_and_web_families_are_there(monkeypatch: Any) -> None:
    parsed = parse(exposition(registry=registry_with(WebMetrics(), None, monkeypatch)))
    assert "superfluid_worker_connected" in parsed and "superfluid_key_requests" in parsed
    assert "superfluid_lanes_active" not in parsed and "superfluid_pool_blocks_total" not in parsed


def test_with_several_models_the_routers_families_replace_the_workers_and_name_each_model(monkeypatch: Any) -> None:
    h = Histogram((1.0, 10.0))
    h.observe(2.0)
    router = {
        "queue_depth_by_band": {"interactive": 0, "normal": 3, "batch": 1},
        "queue_oldest_wait_s_by_band": {"interactive": 0.0, "normal": 1.5, "batch": 9.0},
        "dispatched_by_band": {"interactive": 0, "normal": 7, "batch": 2},
        "reorders": {"aging": 0, "swap_affinity": 1},
        "loads": {"a": 1, "b": 2},
        "load_seconds": {"a": h.stats(), "b": Histogram((1.0, 10.0)).stats()},
        "states": {"a": "loaded", "b": "unloaded"},
    }
    snapshot = {"metrics": {"lanes_total": 1}, "counters": {"dispatched_normal": 99, "reorders_swap_affinity": 50, "admitted": 4}}
    other = {"metrics": {"lanes_total": 2}, "counters": {"admitted": 30}}
    router["snapshots"] = {"a": snapshot, "b": other}  # each loaded model's worker
    # c's worker is away (crashed, restarting): its link has no snapshot to show (api/metrics.py live_snapshot)
    router["links"] = {"a": {"connected": True, "restarts": 2, "inflight": 3}, "b": {"connected": True, "restarts": 0, "inflight": 0}, "c": {"connected": False, "restarts": 1, "inflight": 0}}
    monkeypatch.setattr(metrics_module, "web_metrics", WebMetrics())
    registry = CollectorRegistry()
    registry.register(SuperfluidCollector(lambda: (snapshot, True, 0, 0), lambda: router))
    text = exposition(registry=registry)
    assert text.count("# TYPE llamaswap_scheduler_reorders_total counter") == 1  # the worker's is left out
    parsed = parse(text)
    assert {s.labels["reason"]: s.value for s in parsed["llamaswap_scheduler_reorders"].samples} == {"aging": 0, "swap_affinity": 1}
    assert {s.labels["band"]: s.value for s in parsed["llamaswap_scheduler_dispatched"].samples} == {"interactive": 0, "normal": 7, "batch": 2}
    assert {s.labels["band"]: s.value for s in parsed["llamaswap_scheduler_queue_depth"].samples} == {"interactive": 0, "normal": 3, "batch": 1}
    assert {s.labels["model"]: s.value for s in parsed["superfluid_model_loads"].samples} == {"a": 1, "b": 2}
    shown = {(s.labels["model"], s.labels["state"]) for s in parsed["superfluid_model_state"].samples if s.value == 1}
    assert shown == {("a", "loaded"), ("b", "unloaded")}
    count = {s.labels["model"]: s.value for s in parsed["superfluid_model_load_seconds"].samples if s.name.endswith("_count")}
    assert count == {"a": 1, "b": 0}
    # each model's worker families, labelled by model: no series jumps with the model used last
    assert {s.labels["model"]: s.value for s in parsed["superfluid_lanes_active"].samples} == {"a": 1, "b": 2}
    assert {s.labels["model"]: s.value for s in parsed["superfluid_admitted"].samples} == {"a": 4, "b": 30}
    assert text.count("# TYPE superfluid_admitted_total counter") == 1
    # each model's link, where the pool's own (which submits nothing) said 1, 0 and 0
    assert {s.labels["model"]: s.value for s in parsed["superfluid_worker_connected"].samples} == {"a": 1, "b": 1, "c": 0}
    assert {s.labels["model"]: s.value for s in parsed["superfluid_worker_restarts"].samples if s.name.endswith("_total")} == {"a": 2, "b": 0, "c": 1}
    assert {s.labels["model"]: s.value for s in parsed["superfluid_requests_inflight"].samples} == {"a": 3, "b": 0, "c": 0}


def test_web_metrics_count_requests_rejections_and_tokens_per_key(monkeypatch: Any) -> None:
    m = WebMetrics()
    ok = RequestRecord(endpoint="chat", key_name="alice", qos="agent", status=200, usage={"prompt_tokens": 12, "completion_tokens": 5})
    refused = RequestRecord(endpoint="chat", key_name="bob", status=429, error_code="rate_limit_exceeded")
    gone = RequestRecord(endpoint="completions", status=499, error_code="client_disconnected", qos="agent")
    for r in (ok, ok, refused, gone):
        m.observe(r)
    parsed = parse(exposition(registry=registry_with(m, None, monkeypatch)))
    reqs = {(s.labels["key"], s.labels["endpoint"], s.labels["class"]): s.value for s in parsed["superfluid_key_requests"].samples}
    assert reqs == {("alice", "chat", "agent"): 2, ("bob", "chat", "none"): 1, ("anonymous", "completions", "agent"): 1}
    rejections = {(s.labels["key"], s.labels["code"]): s.value for s in parsed["superfluid_key_rejections"].samples}
    assert rejections == {("bob", "rate_limit_exceeded"): 1}  # a client that went away is no rejection
    tokens = {(s.labels["key"], s.labels["kind"]): s.value for s in parsed["superfluid_key_tokens"].samples}
    assert tokens == {("alice", "prompt"): 24, ("alice", "completion"): 10}
    statuses = {(s.labels["endpoint"], s.labels["status"]): s.value for s in parsed["superfluid_http_generation_requests"].samples}
    assert statuses[("chat", "200")] == 2 and statuses[("chat", "429")] == 1
    counts = {s.labels["endpoint"]: s.value for s in parsed["superfluid_http_generation_duration_seconds"].samples if s.name.endswith("_count")}
    assert counts == {"chat": 3, "completions": 1}


def test_a_non_admin_key_sees_only_its_own_per_key_series_and_everything_else(monkeypatch: Any) -> None:
    m = WebMetrics()
    m.observe(RequestRecord(endpoint="chat", key_name="alice", qos="agent", status=200))
    m.observe(RequestRecord(endpoint="chat", key_name="bob", qos="agent", status=403, error_code="forbidden"))
    registry = registry_with(m, {"metrics": {"lanes_total": 2}}, monkeypatch)

    def keys(text: str, name: str) -> set[str]:
        return {s.labels["key"] for s in parse(text)[name].samples}

    assert keys(exposition(None, False, registry), "superfluid_key_requests") == {"alice", "bob"}  # no key: loopback
    assert keys(exposition("root", True, registry), "superfluid_key_requests") == {"alice", "bob"}  # admin
    alice = exposition("alice", False, registry)
    assert keys(alice, "superfluid_key_requests") == {"alice"}
    assert keys(alice, "superfluid_key_rejections") == set()
    everything = parse(exposition(None, True, registry))
    for name in ("superfluid_http_generation_requests", "superfluid_lanes_total", "superfluid_worker_connected"):
        assert parse(alice)[name].samples == everything[name].samples


@settings(max_examples=60, deadline=None)
@given(name=st.text(min_size=1, max_size=40), other=st.text(min_size=1, max_size=40))
def test_any_key_name_round_trips_through_the_text_format_and_sees_only_itself(name: str, other: str) -> None:
    """Key names are free text chosen by an admin: quotes, backslashes and newlines must neither
    break the format nor let one key's view include another key's series."""
    m = WebMetrics()
    m.observe(RequestRecord(endpoint="chat", key_name=name, qos="agent", status=200))
    m.observe(RequestRecord(endpoint="chat", key_name=other, qos="agent", status=429, error_code="rate_limit_exceeded"))
    original = metrics_module.web_metrics
    metrics_module.web_metrics = m
    try:
        registry = CollectorRegistry()
        registry.register(SuperfluidCollector(lambda: None))
        seen = parse(exposition(name, False, registry))
    finally:
        metrics_module.web_metrics = original
    assert {s.labels["key"] for s in seen["superfluid_key_requests"].samples} == {name}
    if other != name:
        assert seen["superfluid_key_rejections"].samples == []


def key_runtime_of(*keys: tuple[str, str, bool] | tuple[str, str, bool, tuple[str, ...]]) -> Any:
    """A key runtime on the running loop holding (secret, name, admin[, allowed models]) keys,
    no database watcher."""
    import asyncio

    from keys.credentials import digest_of
    from keys.runtime import Key, KeyRuntime, Policy, Snapshot

    rt = KeyRuntime(asyncio.get_running_loop(), watch=False)
    found = {}
    for i, (secret, name, admin, *allowed) in enumerate(keys):
        policy = Policy(name=f"p-{name}", is_admin=admin, allowed_models=allowed[0] if allowed else ())
        k = Key(id=i + 1, name=name, digest=digest_of(secret), policy=policy)
        found[k.digest] = k
    rt.snapshot = Snapshot(version=1, keys_by_digest=found)
    rt.loaded.set()
    rt.touch = lambda key: None
    return rt


async def test_the_metrics_view_filters_per_key_series_by_the_scraping_key(monkeypatch: Any) -> None:
    from django.test import RequestFactory, override_settings

    import api.admission

    rt = key_runtime_of(("sf-alice", "alice", False), ("sf-root", "root", True))
    monkeypatch.setattr(api.admission, "key_runtime", lambda: rt)
    monkeypatch.setattr(metrics_module.collector, "link", lambda: None)
    web = WebMetrics()
    web.observe(RequestRecord(endpoint="chat", key_name="alice", qos="agent", status=200))
    web.observe(RequestRecord(endpoint="chat", key_name="bob", qos="agent", status=429, error_code="rate_limit_exceeded"))
    monkeypatch.setattr(metrics_module, "web_metrics", web)

    async def scrape(secret: str | None) -> tuple[int, set[str]]:
        headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"} if secret else {}
        response = await metrics_module.metrics(RequestFactory().get("/metrics", **headers))
        if response.status_code != 200:
            return response.status_code, set()
        fams = parse(response.content.decode())
        return 200, {s.labels["key"] for s in fams["superfluid_key_requests"].samples}

    with override_settings(SUPERFLUID_KEYS_REQUIRED=False):
        assert await scrape(None) == (200, {"alice", "bob"})
        assert await scrape("sf-alice") == (200, {"alice"})
        assert await scrape("sf-root") == (200, {"alice", "bob"})
    with override_settings(SUPERFLUID_KEYS_REQUIRED=True):
        assert (await scrape(None))[0] == 401
        assert await scrape("sf-alice") == (200, {"alice"})


def test_made_up_http_methods_mint_no_series_of_their_own() -> None:
    """Any client could send 50 made-up methods to /health and add 50 histograms (~20 lines
    each) to /metrics, kept for the life of the process: django-prometheus labelled its latency
    family with the raw method. Every one is ``<invalid method>`` now."""
    from django.test import Client
    from prometheus_client import REGISTRY, generate_latest

    client = Client()
    for i in range(5):
        assert client.generic(f"XMADE{i}", "/health", HTTP_HOST="localhost").status_code == 405
    text = generate_latest(REGISTRY).decode()
    assert "XMADE" not in text
    assert 'method="<invalid method>"' in text
