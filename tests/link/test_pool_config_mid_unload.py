"""The several-models pool (scheduler/link/pool.py) when the admin's live worker settings
(``PoolLink.configure_models``: class-lane caps) arrive while a model is being unloaded."""

from __future__ import annotations

import asyncio
from pathlib import Path

from scheduler.link.messages import Config
from scheduler.link.pool import ModelPool, PoolSetup
from scheduler.models_config import ModelsConfig, ServedModel

from .test_pool_failures import Startable, loaded, settle


async def test_settings_sent_while_a_model_unloads_do_not_restart_its_closed_link() -> None:
    """configure_models went through the links it saw at its start, pausing on each send to a
    connected worker (a full socket). A model unloaded during such a pause (its TTL, the admin's
    Unload, a swap) had its link closed; the settings then restarted that closed link's reader
    (``configure`` starts a link), which nobody held any more: a task polling every 0.1 s for a
    worker that never comes, for the life of the server, one more per such change."""
    cfg = ModelsConfig((ServedModel("a", Path("/m/a.gguf")), ServedModel("b", Path("/m/b.gguf"))), max_loaded_models=2)
    pool = ModelPool(PoolSetup(cfg, spawn=lambda _m, _s: Startable(), lanes={"a": 1, "b": 1}, ctx_sizes={"a": 512, "b": 512}))  # type: ignore[arg-type]
    pool.start()
    for model in ("a", "b"):
        pool.load(model)
        await settle()
        await loaded(pool, model)
    link_a, link_b = pool.links["a"], pool.links["b"]
    paused = asyncio.Event()
    resume = asyncio.Event()

    async def full_socket(_data: bytes) -> None:  # a's worker reads slowly
        paused.set()
        await resume.wait()

    link_a._send = full_socket  # type: ignore[method-assign]
    change = asyncio.ensure_future(pool.link.configure_models({"": Config(class_lanes={"batch": 1})}))
    await asyncio.wait_for(paused.wait(), 10)
    pool.unload("b")  # idle: its worker is stopped now, its link closed
    for _ in range(50):
        await settle()
        if "b" not in pool.links and link_b._task is None:
            break
    assert "b" not in pool.links and link_b._task is None
    resume.set()
    await asyncio.wait_for(change, 10)
    assert link_b._task is None, "the closed link of the unloaded model was started again"
    assert pool.links == {"a": link_a}
    await link_a.stop()
    pool.kill()
    if pool._ticker is not None:
        pool._ticker.cancel()
