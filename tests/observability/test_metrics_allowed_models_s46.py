"""/metrics as a key limited to some models sees it: with several models, the series labelled by
a model the key's policy does not allow are left out, as /v1/models, /props and a chat leave that
model out (404 ``model_not_found``: it is not there for that key). A model's name in a label is
as telling as in /v1/models."""

from __future__ import annotations

from typing import Any

from django.test import RequestFactory, override_settings
from prometheus_client.parser import text_string_to_metric_families

import api.admission
import api.metrics as metrics_module
from api.metrics import WebMetrics

from .test_docs_metrics import router_stats
from .test_exposition import key_runtime_of


async def test_a_key_limited_to_some_models_sees_no_series_of_another_model(monkeypatch: Any) -> None:
    rt = key_runtime_of(("sf-alice", "alice", False, ("smol",)), ("sf-any", "any", False, ()), ("sf-root", "root", True, ("smol",)))
    monkeypatch.setattr(api.admission, "key_runtime", lambda: rt)
    monkeypatch.setattr(metrics_module.collector, "link", lambda: (None, True, 0, 0))
    monkeypatch.setattr(metrics_module.collector, "router", lambda: router_stats("smol", "secret-finetune", load_s=0.5, restarts=0))
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
