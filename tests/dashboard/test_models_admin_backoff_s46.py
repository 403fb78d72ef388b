"""The admin's "Served models" page shows a model whose load failed as backed off: the failure's
message and how long requests for it are still refused (the admin's Load tries it at once)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client

from scheduler.engines.sim import FakeClock
from scheduler.link import pool as pool_mod
from scheduler.link.pool import ModelPool, PoolSetup
from scheduler.models_config import ModelsConfig, ServedModel

from .test_models_admin import URL, cells


@pytest.mark.django_db
def test_a_model_whose_load_failed_shows_its_error_and_the_backoff_left(admin_client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = ModelsConfig((ServedModel("a", Path("/m/a.gguf")), ServedModel("b", Path("/m/b.gguf"))))
    clock = FakeClock()
    pool = ModelPool(PoolSetup(cfg, spawn=lambda *_: None, lanes={"a": 1, "b": 1}), clock)  # type: ignore[arg-type]
    pool.router.request_load("b")
    pool.router.schedule()
    pool.router.load_failed("b")
    pool.errors["b"] = "The model 'b' could not be loaded: invalid magic."
    clock.advance(1.5)
    monkeypatch.setitem(pool_mod._POOLS, -1, pool)
    html = admin_client.get(URL).content.decode()
    a, b = cells(html, "a"), cells(html, "b")
    assert b["state"] == "unloaded"
    assert b["error"] == "The model &#x27;b&#x27; could not be loaded: invalid magic. Requests are refused for 4 s more; Load tries it now."
    assert a["error"] == ""
    clock.advance(3.5)  # the backoff has passed: the error stays, the refusal is over
    assert cells(admin_client.get(URL).content.decode(), "b")["error"] == "The model &#x27;b&#x27; could not be loaded: invalid magic."
