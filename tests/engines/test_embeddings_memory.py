"""The llama.cpp engine's embeddings context and its memory. llama.cpp outputs every token of a
pooled input and keeps a logits row (the vocabulary's width) for each, for the context's life: the
one context sized to the lane (4,096 tokens) grew by ~786 MB of SmolLM2 logits after one long input
and kept them, and a 128k-vocabulary model's by 2 GB. The context kept between requests now takes
``EMBED_KEPT_TOKENS``; a longer input is embedded in a context of its own, freed after it."""

from __future__ import annotations

from typing import Any

import llama_cpp
import numpy as np
import pytest

from scheduler.engines import llama_cpp as engine_module

pytestmark = pytest.mark.model

TEXT = "The tide came in over the flats while the gulls argued about the nets. "


def long_input(engine: Any, n: int) -> list[int]:
    tokens = engine.embedding_tokens(TEXT * (n // 10))
    assert len(tokens) > n  # the premise: longer than the kept context takes
    return tokens[:n]


def test_a_long_input_leaves_the_kept_embeddings_context_at_its_small_size(engine: Any) -> None:
    engine.embed(engine.embedding_tokens("hello"))
    kept = engine._embed_ctx
    assert llama_cpp.llama_n_ubatch(kept) == engine_module.EMBED_KEPT_TOKENS
    vector = engine.embed(long_input(engine, 700))
    assert len(vector) == llama_cpp.llama_model_n_embd(engine._model)
    assert engine._embed_ctx is kept and llama_cpp.llama_n_ubatch(kept) == engine_module.EMBED_KEPT_TOKENS


def test_a_long_input_embeds_as_in_a_context_that_keeps_its_size(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The vector of an input embedded in a context of its own is the one a kept context large
    enough for it gives (the same single ubatch), and a short input's is unchanged too."""
    tokens, short = long_input(engine, 600), engine.embedding_tokens(TEXT)
    own, short_kept = engine.embed(tokens), engine.embed(short)
    with engine._score_lock:
        llama_cpp.llama_free(engine._embed_ctx)
        engine._embed_ctx = None
    monkeypatch.setattr(engine_module, "EMBED_KEPT_TOKENS", engine.lane_ctx)  # the old, one large context
    kept, short_large = engine.embed(tokens), engine.embed(short)
    assert llama_cpp.llama_n_ubatch(engine._embed_ctx) == engine.lane_ctx
    np.testing.assert_allclose(own, kept, rtol=0, atol=1e-5)
    np.testing.assert_allclose(short_kept, short_large, rtol=0, atol=1e-5)
    with engine._score_lock:  # the next test's engine state: the kept context at its usual size
        llama_cpp.llama_free(engine._embed_ctx)
        engine._embed_ctx = None
