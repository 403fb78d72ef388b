"""/metrics rendering: valid Prometheus text, web-side per-key counters and who sees them."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from api.metrics import WebMetrics, render, visible_families
from api.records import RequestRecord
from scheduler.worker.metrics import Histogram, family


def parse(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_render_produces_text_that_prometheus_parses_with_help_type_and_histogram_series() -> None:
    h = Histogram((0.1, 1.0, float("inf")))
    for v in (0.05, 0.5, 3.0):
        h.observe(v)
    fams = {
        "x_requests_total": family("counter", "Requests.", [({"band": "batch"}, 3), ({"band": 'we"ird\\'}, 1)]),
        "x_depth": family("gauge", "Depth.\nTwo lines.", [({}, 2.5)]),
        "x_seconds": family("histogram", "Seconds.", [({"class": "agent"}, h.export())]),
    }
    text = render(fams)
    assert "# TYPE x_seconds histogram" in text and "# HELP x_depth Depth.\\nTwo lines." in text
    assert 'x_seconds_bucket{class="agent",le="+Inf"} 3' in text
    parsed = parse(text)
    assert parsed["x_requests"].type == "counter"
    assert {s.labels["band"] for s in parsed["x_requests"].samples} == {"batch", 'we"ird\\'}
    buckets = [s for s in parsed["x_seconds"].samples if s.name == "x_seconds_bucket"]
    assert [(s.labels["le"], s.value) for s in buckets] == [("0.1", 1), ("1.0", 2), ("+Inf", 3)]
    assert [s.value for s in parsed["x_seconds"].samples if s.name == "x_seconds_count"] == [3]


def test_web_metrics_count_requests_rejections_and_tokens_per_key() -> None:
    m = WebMetrics()
    ok = RequestRecord(endpoint="chat", key_name="alice", qos="agent", status=200, usage={"prompt_tokens": 12, "completion_tokens": 5})
    refused = RequestRecord(endpoint="chat", key_name="bob", status=429, error_code="rate_limit_exceeded")
    gone = RequestRecord(endpoint="completions", status=499, error_code="client_disconnected", qos="agent")
    for r in (ok, ok, refused, gone):
        m.observe(r)
    parsed = parse(render(m.families()))
    reqs = {(s.labels["key"], s.labels["endpoint"], s.labels["class"]): s.value for s in parsed["superfluid_key_requests"].samples}
    assert reqs == {("alice", "chat", "agent"): 2, ("bob", "chat", "none"): 1, ("anonymous", "completions", "agent"): 1}
    rejections = {(s.labels["key"], s.labels["code"]): s.value for s in parsed["superfluid_key_rejections"].samples}
    assert rejections == {("bob", "rate_limit_exceeded"): 1}  # a client that went away is no rejection
    tokens = {(s.labels["key"], s.labels["kind"]): s.value for s in parsed["superfluid_key_tokens"].samples}
    assert tokens == {("alice", "prompt"): 24, ("alice", "completion"): 10}
    statuses = {(s.labels["endpoint"], s.labels["status"]): s.value for s in parsed["superfluid_http_generation_requests"].samples}
    assert statuses[("chat", "200")] == 2 and statuses[("chat", "429")] == 1


def test_a_non_admin_key_sees_only_its_own_per_key_series_and_everything_else() -> None:
    m = WebMetrics()
    m.observe(RequestRecord(endpoint="chat", key_name="alice", qos="agent", status=200))
    m.observe(RequestRecord(endpoint="chat", key_name="bob", qos="agent", status=403, error_code="forbidden"))
    fams = m.families()

    def keys(view: dict[str, Any], name: str) -> set[str]:
        return {labels["key"] for labels, _ in view[name]["samples"]}

    assert keys(visible_families(fams, None, False), "superfluid_key_requests_total") == {"alice", "bob"}  # no key: loopback
    assert keys(visible_families(fams, "root", True), "superfluid_key_requests_total") == {"alice", "bob"}  # admin
    alice = visible_families(fams, "alice", False)
    assert keys(alice, "superfluid_key_requests_total") == {"alice"}
    assert keys(alice, "superfluid_key_rejections_total") == set()
    assert alice["superfluid_http_generation_requests_total"] == fams["superfluid_http_generation_requests_total"]


def _runtime(*keys: tuple[str, str, bool]) -> Any:
    """A key runtime on the running loop holding (secret, name, admin) keys, no database watcher."""
    import asyncio

    from keys.credentials import digest_of
    from keys.runtime import Key, KeyRuntime, Policy, Snapshot

    rt = KeyRuntime(asyncio.get_running_loop(), watch=False)
    found = {}
    for i, (secret, name, admin) in enumerate(keys):
        k = Key(id=i + 1, name=name, digest=digest_of(secret), policy=Policy(name=f"p-{name}", is_admin=admin))
        found[k.digest] = k
    rt.snapshot = Snapshot(version=1, keys_by_digest=found)
    rt.loaded.set()
    rt.touch = lambda key: None
    return rt


async def test_the_metrics_view_filters_per_key_series_by_the_scraping_key(monkeypatch: Any) -> None:
    from django.test import RequestFactory, override_settings

    import api.admission
    import api.metrics as metrics_module

    rt = _runtime(("sf-alice", "alice", False), ("sf-root", "root", True))
    monkeypatch.setattr(api.admission, "get_runtime", lambda: rt)
    monkeypatch.setattr(metrics_module, "worker_families", lambda: {})
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
