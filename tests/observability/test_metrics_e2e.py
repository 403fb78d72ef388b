"""A scrape of /metrics on the real server during and after real traffic; /slots; the activity log."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.server import RunningServer, lane_count

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"
CLASSES = {"interactive", "completion", "agent", "background"}
BANDS = {"interactive", "normal", "batch"}

# every name the issue and the two seeds give, with the labels each must carry
GAUGES = [
    "superfluid_prefill_budget_tokens", "superfluid_decode_grant_tokens", "superfluid_lanes_active",
    "superfluid_pool_blocks_used", "superfluid_pool_blocks_total", "superfluid_pool_blocks_cached",
    "superfluid_pool_blocks_pinned",
]  # fmt: skip
COUNTERS = [
    "superfluid_preemptions_total", "superfluid_prefix_cache_hits_total", "superfluid_prefix_cache_tokens_reused_total",
    "superfluid_parks_total", "superfluid_resumes_total", "superfluid_lane_moves_total", "superfluid_evictions_total",
    "superfluid_decode_tokens_total", "superfluid_prefill_tokens_total",
]  # fmt: skip
REQUIRED: dict[str, tuple[str, set[str]]] = {
    **{name: ("gauge", set()) for name in GAUGES},
    **{name: ("counter", set()) for name in COUNTERS},
    "superfluid_queue_depth": ("gauge", {"class"}),
    "superfluid_ttft_seconds": ("histogram", {"class"}),
    "superfluid_queue_wait_seconds": ("histogram", {"class"}),
    "superfluid_os_pressure_total": ("counter", {"level"}),
    "llamaswap_scheduler_queue_depth": ("gauge", {"band"}),
    "llamaswap_scheduler_queue_oldest_wait_seconds": ("gauge", {"band"}),
    "llamaswap_scheduler_dispatched_total": ("counter", {"band"}),
    "llamaswap_scheduler_reorders_total": ("counter", {"reason"}),
    "superfluid_key_requests_total": ("counter", {"key", "endpoint", "class"}),
    "superfluid_key_rejections_total": ("counter", {"key", "code"}),
    "django_http_requests_total_by_method_total": ("counter", {"method"}),
}


class Scrape:
    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        self.types: dict[str, str] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                self.samples.setdefault(s.name, []).append((s.labels, s.value))
                self.types[s.name] = fam.type

    def value(self, name: str, **labels: str) -> float:
        return sum(v for lab, v in self.samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))

    def label_values(self, name: str, label: str) -> set[str]:
        return {lab[label] for lab, _ in self.samples.get(name, []) if label in lab}


def scrape(srv: RunningServer) -> Scrape:
    r = httpx.get(srv.base + "/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return Scrape(r.text)


@pytest.fixture
def server(shared_server: RunningServer) -> RunningServer:
    """The session's shared real server (tests/conftest.py): this test counts deltas and its
    own requests' rows, not totals."""
    return shared_server


def chat(srv: RunningServer, content: str, max_tokens: int, headers: dict[str, str] | None = None, stream: bool = False) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    return httpx.post(srv.base + "/v1/chat/completions", json=body, headers=headers or {}, timeout=180)


def assert_all_exported(s: Scrape, skip: tuple[str, ...] = ()) -> None:
    """Every required family is there, with its type and a sample carrying each of its labels."""
    for name, (kind, labels) in REQUIRED.items():
        if name.startswith(skip or ("\0",)):
            continue
        sample_name = name + "_bucket" if kind == "histogram" else name
        assert sample_name in s.samples, f"{name} is missing"
        assert s.types[sample_name] == kind, (name, s.types[sample_name])
        for label in labels:
            assert s.label_values(sample_name, label), (name, label)
        if kind == "histogram":
            assert name + "_sum" in s.samples and name + "_count" in s.samples


def assert_histograms_are_consistent(s: Scrape, name: str) -> None:
    by_series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    for labels, value in s.samples[name + "_bucket"]:
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        by_series.setdefault(key, []).append((float(labels["le"]), value))
    assert by_series, name
    for key, buckets in by_series.items():
        buckets.sort()
        counts = [c for _, c in buckets]
        assert counts == sorted(counts), (name, key)  # cumulative
        assert buckets[-1][0] == float("inf")
        assert counts[-1] == s.value(name + "_count", **dict(key))


def test_every_metric_is_exported_during_and_after_real_traffic_and_counters_move(server: RunningServer) -> None:
    before = scrape(server)
    assert_all_exported(before, skip=("superfluid_key_",))  # per-key series appear with the first request
    assert before.label_values("superfluid_queue_depth", "class") == CLASSES
    assert before.label_values("llamaswap_scheduler_queue_depth", "band") == BANDS
    assert before.label_values("llamaswap_scheduler_reorders_total", "reason") == {"aging", "swap_affinity"}
    assert before.value("superfluid_pool_blocks_total") > 0

    # long agent streams fill every lane; an interactive request then preempts one of them
    lanes = lane_count(server)
    log_start = len(server.log())
    with sqlite3.connect(Path(server.data_dir) / "superfluid.sqlite3") as db:
        (last_row,) = db.execute("SELECT coalesce(max(id), 0) FROM activity_activityentry").fetchone()
    results: dict[str, Any] = {}

    def long_stream(name: str) -> None:
        results[name] = chat(server, f"Write a long story about a lighthouse keeper named {name}.", 96, stream=True)

    threads = [threading.Thread(target=long_stream, args=(n,)) for n in ("Ada", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal")[:lanes]]
    for t in threads:
        t.start()
    server.wait_for(lambda: sum(s["is_processing"] for s in httpx.get(server.base + "/slots").json()) == lanes, timeout_s=60)

    during = scrape(server)
    assert during.value("superfluid_lanes_active") == lanes
    assert during.value("superfluid_requests_inflight") >= lanes
    slots = httpx.get(server.base + "/slots").json()
    assert len(slots) == lanes
    for slot in slots:
        assert {"id", "id_task", "n_ctx", "is_processing", "next_token", "prompt_progress", "parked", "key", "class", "state", "generated", "prompt_tokens", "prompt_done"} <= set(slot)
        assert slot["class"] == "agent" and slot["state"] in ("prefill", "decode") and 0 <= slot["prompt_progress"] <= 1
        assert slot["n_ctx"] == 2048 and slot["parked"] is False

    urgent = chat(server, "Say hi.", 8, headers={"x-superfluid-qos": "interactive", "x-llamaswap-priority": "interactive"})
    assert urgent.status_code == 200
    batch = chat(server, "Say bye.", 8, headers={"x-llamaswap-priority": "batch"})
    assert batch.status_code == 200
    too_long = chat(server, "word " * 3000, 8)
    assert too_long.status_code == 400
    for t in threads:
        t.join(timeout=180)
    assert all(r.status_code == 200 for r in results.values())
    ours = [r.headers["x-request-id"] for r in (*results.values(), urgent, batch)]  # the refused one has none
    sent = len(ours) + 1

    def delta(s: Scrape, name: str, **labels: str) -> float:
        return s.value(name, **labels) - before.value(name, **labels)

    # the snapshot after the last finish: every lane free, every finished stream counted
    after = server.wait_for(
        lambda: (s := scrape(server)).value("superfluid_lanes_active") == 0
        and delta(s, "superfluid_ttft_seconds_count", **{"class": "agent"}) >= lanes
        and s,
        timeout_s=30,
    )
    assert_all_exported(after)
    assert delta(after, "superfluid_preemptions_total") >= 1
    assert delta(after, "superfluid_admitted_total") >= sent - 1
    assert delta(after, "llamaswap_scheduler_dispatched_total", band="interactive") >= 1
    assert delta(after, "llamaswap_scheduler_dispatched_total", band="batch") >= 1
    assert delta(after, "llamaswap_scheduler_dispatched_total", band="normal") >= lanes
    assert delta(after, "superfluid_ttft_seconds_count", **{"class": "interactive"}) >= 1
    assert delta(after, "superfluid_ttft_seconds_sum", **{"class": "agent"}) > 0
    assert delta(after, "superfluid_queue_wait_seconds_count", **{"class": "background"}) >= 1
    assert delta(after, "superfluid_decode_tokens_total") > 50
    assert delta(after, "superfluid_prefill_tokens_total") > 0
    assert delta(after, "superfluid_key_requests_total", key="anonymous", endpoint="chat") >= sent
    assert delta(after, "superfluid_key_rejections_total", key="anonymous", code="context_length_exceeded") == 1
    assert delta(after, "superfluid_http_generation_requests_total", endpoint="chat", status="400") == 1
    assert delta(after, "django_http_requests_total_by_method_total", method="GET") > 0
    for name in ("superfluid_ttft_seconds", "superfluid_queue_wait_seconds", "superfluid_tick_duration_seconds"):
        assert_histograms_are_consistent(after, name)

    # the activity log has one content-free row per request, and the access log one line each
    def our_rows() -> list[tuple]:
        with sqlite3.connect(Path(server.data_dir) / "superfluid.sqlite3") as db:
            marks = ",".join("?" * len(ours))
            return db.execute(
                "SELECT qos_class, band, status, error_code, prompt_tokens, completion_tokens, ttft_ms, finish_reason, preemptions"
                f" FROM activity_activityentry WHERE id > ? AND (request_id IN ({marks}) OR status = 400)",
                (last_row, *ours),
            ).fetchall()

    rows = server.wait_for(lambda: len(r := our_rows()) == sent and r, timeout_s=30)
    statuses = sorted(r[2] for r in rows)
    assert statuses == [200] * (sent - 1) + [400]
    assert ("interactive", "interactive") in {(r[0], r[1]) for r in rows} and ("background", "batch") in {(r[0], r[1]) for r in rows}
    assert any(r[3] == "context_length_exceeded" for r in rows)
    served = [r for r in rows if r[2] == 200]
    assert all(r[4] and r[5] and r[6] is not None and r[7] for r in served)
    assert sum(r[8] for r in served) >= 1  # the preempted story
    access = [line for line in server.log()[log_start:].splitlines() if "superfluid.access" in line]
    assert len(access) == sent and not any("lighthouse" in line for line in access)
