"""Several models, through the real ASGI application and the real pool and router: a model whose
worker cannot start is refused at once for its load backoff, with 503 ``engine_unavailable``, the
failure's message and a ``Retry-After`` of the seconds left; no worker is started for it
meanwhile. ``GET /v1/internal/models`` shows its failures and backoff; the admin's Load
(``POST /v1/internal/models/<id>/load``) tries it at once."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from scheduler.engines.sim import FakeClock
from scheduler.link import pool as pool_module
from scheduler.link.pool import ModelPool, PoolSetup
from scheduler.models_config import ModelsConfig, ServedModel
from tests.edge.inproc import JSON, MODEL, SimWorker, attached, chat_body, request

pytestmark = pytest.mark.django_db(transaction=True)


class Unstartable:
    """A model's worker supervisor whose process dies at start (a corrupt GGUF)."""

    def __init__(self) -> None:
        self.exited = threading.Event()
        self.fatal: str | None = None
        self.on_fatal: Any = None
        self.restarts = 0

    def start(self) -> None:
        raise RuntimeError("llama_model_load: invalid magic")

    def drain(self) -> None:
        self.exited.set()

    def kill(self) -> None:
        self.exited.set()


async def test_a_model_that_failed_to_load_is_refused_with_retry_after_until_its_backoff_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    spawned: list[Unstartable] = []

    def spawn(_model: str, _sockets: Any) -> Unstartable:
        spawned.append(Unstartable())
        return spawned[-1]

    setup = PoolSetup(ModelsConfig((ServedModel(MODEL, Path("/m/broken.gguf")),)), spawn=spawn, lanes={MODEL: 2}, ctx_sizes={MODEL: 512})  # type: ignore[arg-type]
    clock = FakeClock()
    pool = ModelPool(setup, clock)
    monkeypatch.setattr(pool_module, "_SETUP", setup)
    loop_id = id(asyncio.get_running_loop())
    pool_module._POOLS[loop_id] = pool
    try:
        async with attached(SimWorker()):

            async def chat() -> Any:
                reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON)
                assert reply.status == 503 and reply.is_error_object(), reply.body
                assert reply.json()["error"]["code"] == "engine_unavailable"
                assert "invalid magic" in reply.json()["error"]["message"], reply.body
                return reply

            first = await chat()  # it tries the load, which fails
            assert len(spawned) == 1 and first.headers["retry-after"] == "5"
            clock.advance(1.5)
            second = await chat()  # refused at once: no worker is started for it
            assert len(spawned) == 1 and second.headers["retry-after"] == "4"
            assert "not loaded again for 4 s" in second.json()["error"]["message"]

            listed = (await request("GET", "/v1/internal/models")).json()["data"][0]
            assert (listed["state"], listed["load_failures"], listed["load_backoff_s"]) == ("unloaded", 1, 3.5)
            assert "invalid magic" in listed["error"]

            clock.advance(3.5)
            third = await chat()  # the backoff has passed: tried again, and it fails again
            assert len(spawned) == 2 and third.headers["retry-after"] == "10"

            # the admin's Load tries it at once, whatever the backoff
            loaded = await request("POST", f"/v1/internal/models/{MODEL}/load")
            assert loaded.status == 200, loaded.body
            for _ in range(20):
                await asyncio.sleep(0)
            assert len(spawned) == 3
            listed = (await request("GET", "/v1/internal/models")).json()["data"][0]
            assert (listed["load_failures"], listed["load_backoff_s"]) == (1, 5.0)  # failed once more, from the start
    finally:
        pool_module._POOLS.pop(loop_id, None)
        pool.kill()
