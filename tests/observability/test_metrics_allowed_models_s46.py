"""/metrics as a key limited to some models sees it: with several models, the series labelled by
a model the key's policy does not allow are left out, as /v1/models, /props and a chat leave that
model out (404 ``model_not_found``: it is not there for that key). A model's name in a label is
as telling as in /v1/models."""

from __future__ import annotations

import asyncio
from typing import Any

from django.test import RequestFactory, override_settings
from prometheus_client.parser import text_string_to_metric_families

import api.admission
import api.metrics as metrics_module
from api.metrics import WebMetrics
from scheduler.worker.metrics import Histogram

from .test_docs_metrics import worker_snapshot


def router_of(*models: str) -> dict[str, Any]:
    h = Histogram((1.0,))
    h.observe(0.5)
    return {
        "queue_depth_by_band": {},
        "queue_oldest_wait_s_by_band": {},
        "dispatched_by_band": {"normal": 2},
        "reorders": {},
        "loads": {m: 1 for m in models},
        "load_seconds": {m: h.stats() for m in models},
        "states": {m: "loaded" for m in models},
        "snapshots": {m: worker_snapshot() for m in models},
        "links": {m: {"connected": True, "restarts": 0, "inflight": 0} for m in models},
    }


def runtime(*keys: tuple[str, str, bool, tuple[str, ...]]) -> Any:
    """A key runtime on the running loop holding (secret, name, admin, allowed models) keys."""
    from keys.credentials import digest_of
    from keys.runtime import Key, KeyRuntime, Policy, Snapshot

    rt = KeyRuntime(asyncio.get_running_loop(), watch=False)
    found = {}
    for i, (secret, name, admin, allowed) in enumerate(keys):
        policy = Policy(name=f"p-{name}", is_admin=admin, allowed_models=allowed)
        k = Key(id=i + 1, name=name, digest=digest_of(secret), policy=policy)
        found[k.digest] = k
    rt.snapshot = Snapshot(version=1, keys_by_digest=found)
    rt.loaded.set()
    rt.touch = lambda key: None
    return rt


async def test_a_key_limited_to_some_models_sees_no_series_of_another_model(monkeypatch: Any) -> None:
    rt = runtime(("sf-alice", "alice", False, ("smol",)), ("sf-any", "any", False, ()), ("sf-root", "root", True, ("smol",)))
    monkeypatch.setattr(api.admission, "key_runtime", lambda: rt)
    monkeypatch.setattr(metrics_module.collector, "link", lambda: (None, True, 0, 0))
    monkeypatch.setattr(metrics_module.collector, "router", lambda: router_of("smol", "secret-finetune"))
    monkeypatch.setattr(metrics_module, "web_metrics", WebMetrics())

    async def models_seen(secret: str) -> set[str]:
        response = await metrics_module.metrics(RequestFactory().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {secret}"))
        assert response.status_code == 200
        seen = set()
        for fam in text_string_to_metric_families(response.content.decode()):
            seen |= {s.labels["model"] for s in fam.samples if "model" in s.labels}
        return seen

    with override_settings(SUPERFLUID_KEYS_REQUIRED=True):
        assert await models_seen("sf-alice") == {"smol"}
        assert await models_seen("sf-any") == {"smol", "secret-finetune"}  # no list: every model
        assert await models_seen("sf-root") == {"smol", "secret-finetune"}  # an admin sees everything
