"""``GET /v1/internal/models`` says ``loads`` in one meaning: a model's loads that succeeded (its
worker said hello), as ``data[].loads`` and ``superfluid_model_loads_total`` count them. The
router's loads begun, failed ones included, are ``load_attempts``.

Seen: after one failed load the same reply said ``data[0].loads: 0`` and
``router.models.<id>.loads: 1``; an operator reading the router's figure took the broken model
for loaded once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from scheduler.engines.sim import FakeClock
from scheduler.link import pool as pool_module
from scheduler.link.pool import ModelPool, PoolSetup
from scheduler.models_config import ModelsConfig, ServedModel
from tests.api.test_model_load_backoff_s46 import Unstartable
from tests.edge.inproc import JSON, MODEL, SimWorker, attached, chat_body, request

pytestmark = pytest.mark.django_db(transaction=True)


async def test_loads_counts_successful_loads_and_load_attempts_every_one_begun(monkeypatch: pytest.MonkeyPatch) -> None:
    spawned: list[Unstartable] = []

    def spawn(_model: str, _sockets: Any) -> Unstartable:
        spawned.append(Unstartable())
        return spawned[-1]

    setup = PoolSetup(ModelsConfig((ServedModel(MODEL, Path("/m/broken.gguf")),)), spawn=spawn, lanes={MODEL: 2}, ctx_sizes={MODEL: 512})  # type: ignore[arg-type]
    pool = ModelPool(setup, FakeClock())
    monkeypatch.setattr(pool_module, "_SETUP", setup)
    loop_id = id(asyncio.get_running_loop())
    pool_module._POOLS[loop_id] = pool
    try:
        async with attached(SimWorker()):
            failed = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON)
            assert failed.status == 503 and len(spawned) == 1, failed.body
            listed = (await request("GET", "/v1/internal/models")).json()
    finally:
        pool_module._POOLS.pop(loop_id, None)
        pool.kill()
    (model,) = listed["data"]
    router = listed["router"]["models"][MODEL]
    assert model["loads"] == 0 and model["load_failures"] == 1  # none succeeded
    assert router["load_attempts"] == 1 and "loads" not in router, router  # one begun, under its own name
