"""The metric names, types and labels are the interface: what docs/operations.md's tables (and the
names docs/operations.md and docs/configuration.md give in passing, ``name{label,...}``) promise
is what /metrics serves, in every mode (one worker, a Redis fleet, several models)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import api.metrics as metrics_module
from api.metrics import ROUTER_OVERRIDES, SuperfluidCollector, WebMetrics, exposition, snapshot_families
from api.records import RequestRecord
from scheduler.worker.metrics import Histogram

DOCS = Path(__file__).resolve().parents[2] / "docs"
ROW = re.compile(r"^\| `([a-z_]+)` \| (gauge|counter|histogram) \|([^|]*)\|", re.M)
MENTION = re.compile(r"`((?:superfluid|llamaswap)_[a-z_]+)\{([a-z_, ]+)\}")  # `name{label,label}` in prose
NAMED = re.compile(r"`((?:superfluid|llamaswap)_[a-z_]+)[`{]")  # `name` or `name{...}` in prose


FLEET_LABELS = "(Redis mode:"  # a row's labels column: those a family adds in a Redis fleet follow this


def documented_table(fleet: bool = False) -> dict[str, tuple[str, set[str]]]:
    """Metric -> (type, label names) from every table row of docs/operations.md; with ``fleet``,
    those a row says a Redis fleet adds too (``(Redis mode: ... `worker`, `host`)``)."""
    rows = ROW.findall((DOCS / "operations.md").read_text())
    assert len(rows) > 50
    out = {}
    for name, kind, labels in rows:
        own, _, extra = labels.partition(FLEET_LABELS)
        out[name] = (kind, set(re.findall(r"`([a-z_]+)`", own + (extra if fleet else ""))))
    return out


def documented_mentions() -> tuple[set[str], dict[str, set[str]]]:
    """(every metric named in the prose, the label names given with those named ``name{a,b}``)."""
    named: set[str] = set()
    labelled: dict[str, set[str]] = {}
    for doc in ("operations.md", "configuration.md"):
        text = (DOCS / doc).read_text()
        named |= set(NAMED.findall(text))
        for name, labels in MENTION.findall(text):
            labelled[name] = {label.strip() for label in labels.split(",")}
    return named, labelled


def served(snapshot: dict[str, Any], router: dict[str, Any] | None = None) -> dict[str, tuple[str, set[str]]]:
    """Metric (a counter's with its ``_total``) -> (type, label names) as /metrics serves it."""
    web = WebMetrics()
    web.observe(
        RequestRecord(
            endpoint="chat",
            key_name="k",
            qos="agent",
            status=429,
            error_code="rate_limit_exceeded",
            usage={"prompt_tokens": 1},
        )
    )
    original = metrics_module.web_metrics
    metrics_module.web_metrics = web
    try:
        registry = CollectorRegistry()
        registry.register(SuperfluidCollector(lambda: (snapshot, True, 0, 0), lambda: router))
        text = exposition(registry=registry)
    finally:
        metrics_module.web_metrics = original
    out = {}
    for fam in text_string_to_metric_families(text):
        assert fam.samples, f"{fam.name} has no sample: its labels cannot be checked"
        labels = {label for s in fam.samples for label in s.labels} - {"le"}
        out[fam.name + ("_total" if fam.type == "counter" else "")] = (fam.type, labels)
    return out


def worker_snapshot() -> dict[str, Any]:
    h = Histogram((1.0,))
    h.observe(0.5)
    metrics = {
        "finished": {"agent": {"stop": 1}},
        "ttft_s": {"agent": h.stats()},
        "queue_wait_s": {"agent": h.stats()},
        "tick_duration_s": h.stats(),
    }
    return {"metrics": metrics, "counters": {}, "pool": {}}


def fleet_snapshot() -> dict[str, Any]:
    return {
        **worker_snapshot(),
        "fleet": [{"worker": "w1", "host": "h1", "n_lanes": 2, "lanes": [{"job_id": "j"}]}],
        "global_queue": {"agent": 1},
    }


def router_stats(*models: str, load_s: float = 2.0, restarts: int = 1) -> dict[str, Any]:
    """The model router's stats with ``models`` (default one, ``a``) loaded, each loaded once
    in ``load_s``."""
    models = models or ("a",)
    h = Histogram((1.0,))
    h.observe(load_s)
    return {
        "queue_depth_by_band": {},
        "queue_oldest_wait_s_by_band": {},
        "dispatched_by_band": {"normal": 1},
        "reorders": {"aging": 0},
        "loads": {m: 1 for m in models},
        "load_seconds": {m: h.stats() for m in models},
        "states": {m: "loaded" for m in models},
        "snapshots": {m: worker_snapshot() for m in models},
        "links": {m: {"connected": True, "restarts": restarts, "inflight": 0} for m in models},
    }


def test_every_metric_in_the_docs_tables_is_served_with_its_type_and_labels_and_nothing_else_is() -> None:
    table = documented_table()
    single = served(worker_snapshot())
    ours = {n: v for n, v in single.items() if n.startswith(("superfluid_", "llamaswap_"))}
    wrong = {n: (doc, ours.get(n)) for n, doc in table.items() if ours.get(n) != doc}
    assert not wrong, f"documented (type, labels) vs served: {wrong}"
    assert not set(ours) - set(table), f"served but in no table of docs/operations.md: {sorted(set(ours) - set(table))}"


@pytest.mark.parametrize("mode", ["fleet", "models"])
def test_every_family_of_each_mode_is_documented_with_the_labels_it_carries(mode: str) -> None:
    """A Redis fleet adds its families; several models label each worker family by ``model``
    and add the router's. Each is named in the docs, with its labels where the docs give them."""
    got = served(fleet_snapshot()) if mode == "fleet" else served(worker_snapshot(), router_stats())
    table, (named, mentions) = documented_table(fleet=mode == "fleet"), documented_mentions()
    for name, (kind, labels) in got.items():
        if not name.startswith(("superfluid_", "llamaswap_")):
            continue
        assert name in table or name in named, f"{name} is served ({mode}) and named nowhere in the docs"
        if name in mentions:
            assert mentions[name] == labels, (name, labels, mentions[name])
        if name in table:
            doc_kind, doc_labels = table[name]
            assert kind == doc_kind and labels - {"model"} == doc_labels, (name, kind, labels, table[name])
    if mode == "models":  # each worker's families, and its link's, one series per model
        worker = {
            f.name + ("_total" if f.type == "counter" else "")
            for f in snapshot_families(worker_snapshot())
            if f.name not in ROUTER_OVERRIDES
        }
        worker |= {"superfluid_worker_connected", "superfluid_worker_restarts_total", "superfluid_requests_inflight"}
        assert not {n for n in worker if "model" not in got[n][1]}, (
            "with several models every worker family is labelled by model"
        )


def test_every_metric_the_docs_name_is_served_in_some_mode() -> None:
    """The other way round from the tests above: a name the prose gives (`name` or `name{...}`),
    misspelt or of a family since removed, would send an operator's query to nothing."""
    served_names = set(served(worker_snapshot())) | set(served(fleet_snapshot())) | set(served(worker_snapshot(), router_stats()))
    named, _labelled = documented_mentions()
    assert len(named) > 20
    assert sorted(named - served_names) == []
