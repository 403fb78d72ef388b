"""The llama.cpp engine's model facts for llama-server's /v1/models meta and /props' model_ftype
(the worker's hello carries them): the bundled SmolLM2-135M, Q4_1."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.model


def test_the_engine_knows_the_models_n_embd_n_params_size_and_ftype(engine: Any) -> None:
    meta = engine.model_meta
    assert meta["n_embd"] == 576 and meta["ftype"] == "Q4_1"
    assert 100_000_000 < meta["n_params"] < 200_000_000 and 50_000_000 < meta["size"] < 200_000_000


def test_the_workers_hello_carries_them(engine: Any) -> None:
    from scheduler.core.scheduler import SchedulerConfig
    from scheduler.worker.loop import EngineWorker

    hello = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=engine.lane_ctx), model_name="m").hello()
    assert (hello.n_embd, hello.n_params, hello.model_size, hello.model_ftype) == (
        576, engine.model_meta["n_params"], engine.model_meta["size"], "Q4_1"
    )
