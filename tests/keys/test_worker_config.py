"""The ``Config`` link message: the admin's class-lane caps replace the flags' caps class by class."""

from __future__ import annotations

from scheduler.core.qos import QosClass
from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import Config, Submit
from scheduler.worker.loop import EngineWorker


def make_worker(class_lanes: dict[QosClass, int] | None = None, max_batch: int = 4) -> EngineWorker:
    clock = FakeClock()
    engine = SimEngine(n_lanes=max_batch, lane_ctx=512, clock=clock)
    config = SchedulerConfig(max_batch=max_batch, lane_ctx=512, class_lanes=dict(class_lanes or {}))
    return EngineWorker(engine, config, model_name="sim", clock=clock)


def test_config_caps_override_the_flags_per_class_and_fall_back_when_removed() -> None:
    worker = make_worker({QosClass.BACKGROUND: 3, QosClass.AGENT: 4})
    worker.handle(None, Config(class_lanes={"background": 1, "interactive": 2}))  # type: ignore[arg-type]
    assert worker.scheduler.config.class_lanes == {QosClass.BACKGROUND: 1, QosClass.INTERACTIVE: 2, QosClass.AGENT: 4}
    assert worker.snapshot()["class_lanes"] == {"background": 1, "interactive": 2, "agent": 4}
    worker.handle(None, Config(class_lanes={}))  # type: ignore[arg-type]
    assert worker.scheduler.config.class_lanes == {QosClass.BACKGROUND: 3, QosClass.AGENT: 4}


def test_caps_outside_one_to_max_batch_or_naming_no_class_are_ignored() -> None:
    worker = make_worker(max_batch=4)
    worker.handle(None, Config(class_lanes={"background": 5, "agent": 0, "nonsense": 2, "completion": "x", "interactive": 4}))  # type: ignore[arg-type]
    assert worker.scheduler.config.class_lanes == {QosClass.INTERACTIVE: 4}


def test_the_scheduler_admits_no_more_than_the_new_cap() -> None:
    worker = make_worker(max_batch=4)
    worker.handle(None, Config(class_lanes={"background": 1}))  # type: ignore[arg-type]

    class Conn:
        def queue(self, message: dict) -> None:
            pass

    conn = Conn()
    for i in range(3):
        request = {"endpoint": "completions", "prompt": "hello world " * 4, "max_tokens": 50, "temperature": 0}
        worker.handle(conn, Submit(id=f"j{i}", request=request, qos=int(QosClass.BACKGROUND), priority=0))  # type: ignore[arg-type]
    worker.run_tick()
    assert sum(1 for j in worker.scheduler.lanes if j is not None) == 1


async def test_with_several_models_each_models_worker_gets_its_own_caps_also_when_loaded_later() -> None:
    """The admin's caps for model b reached no worker, and model a's were applied to every model's
    worker (the FIM model's too): the key runtime computed the first model's caps only and the
    pool sent that one set to all."""
    import asyncio
    from pathlib import Path
    from typing import Any

    from keys.runtime import KeyRuntime, Snapshot
    from scheduler.link.pool import ModelPool, PoolSetup
    from scheduler.models_config import ModelsConfig, ServedModel
    from superfluid_site.serving import ServingConfig, installed

    cfg = ModelsConfig((ServedModel("a", Path("/m/a.gguf")), ServedModel("b", Path("/m/b.gguf"))))
    pool = ModelPool(PoolSetup(cfg, spawn=lambda *_: None, lanes={"a": 4, "b": 4}, ctx_sizes={"a": 512, "b": 512}))  # type: ignore[arg-type]
    sent: dict[str, Any] = {}

    class Loaded:  # model a's link, loaded: what it is sent
        async def configure(self, config: Config) -> None:
            sent["a"] = config

    pool.links["a"] = Loaded()  # type: ignore[assignment]
    rt = KeyRuntime(asyncio.get_running_loop(), watch=False, link=lambda: pool.link)
    rt.snapshot = Snapshot(version=1, class_lanes={"": {QosClass.BACKGROUND: 2}, "b": {QosClass.BACKGROUND: 1, QosClass.AGENT: 3}, "a": {QosClass.AGENT: 2}})
    with installed(ServingConfig(models=("a", "b"))):
        await rt.push_caps()
    assert sent["a"].class_lanes == {"agent": 2, "background": 2}
    later = pool.link.config_for("b")  # what _load gives model b's link when b is loaded
    assert later is not None and later.class_lanes == {"agent": 3, "background": 1}
    assert pool.link.config_for("a") == sent["a"]


async def test_an_all_models_cap_above_a_smaller_models_lanes_gives_that_model_all_its_lanes() -> None:
    """An all-models cap is checked against the largest model's lanes; sent as it was to a model
    with fewer lanes, that model's worker ignored it (outside 1..max_batch) and kept its
    --class-lanes cap: the admin's "background may hold 4" left background at 1 lane there."""
    import asyncio
    from pathlib import Path
    from typing import Any

    from keys.runtime import KeyRuntime, Snapshot
    from scheduler.link import pool as pool_module
    from scheduler.link.pool import ModelPool, PoolSetup
    from scheduler.models_config import ModelsConfig, ServedModel
    from superfluid_site.serving import ServingConfig, installed

    cfg = ModelsConfig((ServedModel("a", Path("/m/a.gguf")), ServedModel("b", Path("/m/b.gguf"))))
    setup = PoolSetup(cfg, spawn=lambda *_: None, lanes={"a": 8, "b": 2}, ctx_sizes={"a": 512, "b": 512})  # type: ignore[arg-type]
    pool = ModelPool(setup)
    small = make_worker({QosClass.BACKGROUND: 1}, max_batch=2)  # model b's worker, serve --class-lanes background=1
    sent: dict[str, Any] = {}

    class Loaded:
        def __init__(self, model: str) -> None:
            self.model = model

        async def configure(self, config: Config) -> None:
            sent[self.model] = config

    pool.links["a"], pool.links["b"] = Loaded("a"), Loaded("b")  # type: ignore[assignment]
    rt = KeyRuntime(asyncio.get_running_loop(), watch=False, link=lambda: pool.link)
    rt.snapshot = Snapshot(version=1, class_lanes={"": {QosClass.BACKGROUND: 4}})
    pool_module.configure(setup)  # what serve does: the models' lanes
    try:
        with installed(ServingConfig(models=("a", "b"), max_batch=8)):
            await rt.push_caps()
    finally:
        pool_module.configure(None)
    assert sent["a"].class_lanes == {"background": 4}
    small.handle(None, sent["b"])  # type: ignore[arg-type]
    assert small.scheduler.config.class_lanes == {QosClass.BACKGROUND: 2}
