"""/v1/embeddings with a reranker's GGUF (``<arch>.pooling_type`` 4, rank): llama.cpp's pooled
output for it is a score per class, not a vector of n_embd floats; the engine read n_embd floats
from it all the same (memory past the scores: a "vector" of garbage, 3e-41 and zeros among
them). llama-server refuses /v1/embeddings for such a model; so does the worker: 400
``unsupported_parameter``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.model


def test_a_rank_pooling_model_is_refused_embeddings_not_read_past_its_scores(tmp_path: Path) -> None:
    from scheduler.core.scheduler import SchedulerConfig
    from scheduler.engines.base import EngineError
    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.engines.models import default_model_path
    from scheduler.link.messages import Submit
    from scheduler.worker.loop import EngineWorker, Refusal
    from tests.engines.test_mlx_vocab_roles import gguf_with_keys

    gguf = tmp_path / "rank.gguf"
    gguf_with_keys(default_model_path(), gguf, {"llama.pooling_type": 4})
    engine = LlamaCppEngine(gguf, n_lanes=1, lane_ctx=128, adapt_threads=False)
    try:
        with pytest.raises(EngineError, match="rank"):
            engine.embed(engine.embedding_tokens("hello"))
        worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=128), model_name="m")
        request: Any = {"endpoint": "embeddings", "inputs": ["hello"]}
        with pytest.raises(Refusal) as refused:
            worker._embed(Submit(id="e1", request=request), lambda: True)
        assert refused.value.reason == "unsupported_parameter" and refused.value.param == "input" and "rank" in refused.value.detail
    finally:
        engine.close()
