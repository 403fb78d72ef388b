"""The tokens a text input of /v1/embeddings is embedded as, with the real llama.cpp engine: those
llama-server embeds (``tokenize_input_prompts(vocab, prompt, add_special=true, parse_special=true)``,
that is llama.cpp's own special tokens, an EOS/SEP too where the GGUF asks for one:
``tokenizer.ggml.add_eos_token``, as embedding models such as Qwen3-Embedding, with last-token
pooling, and BERT's family do). ``EngineWorker._embed`` tokenised a text with the engine's prompt
tokenizer, which leaves out the EOS on purpose (right for a prompt to continue, not for an input
to embed), so for such a model the vector and the usage differed from llama-server's."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.model

TEXT = "The cat sat on the mat."


class _Conn:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def queue(self, message: Any) -> None:
        self.sent.append(message)


def test_a_text_is_embedded_with_the_special_tokens_llama_server_embeds_it_with(tmp_path: Path) -> None:
    import llama_cpp

    from scheduler.core.scheduler import SchedulerConfig
    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.engines.models import default_model_path
    from scheduler.link.messages import Done, Submit
    from scheduler.worker.loop import EngineWorker
    from tests.engines.test_mlx_vocab_roles import gguf_with_keys

    gguf = tmp_path / "eos.gguf"
    gguf_with_keys(default_model_path(), gguf, {"tokenizer.ggml.add_eos_token": True})
    engine = LlamaCppEngine(gguf, n_lanes=1, lane_ctx=128, adapt_threads=False)
    try:
        data = TEXT.encode()
        buf = (llama_cpp.llama_token * 64)()
        n = llama_cpp.llama_tokenize(engine._vocab, data, len(data), buf, 64, True, True)  # llama-server's call
        server_tokens = list(buf[:n])
        assert server_tokens[-1] == llama_cpp.llama_vocab_eos(engine._vocab)  # the premise: llama.cpp adds it
        worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=128), model_name="m")
        conn = _Conn()
        embedded = worker._embed(Submit(id="e1", request={"endpoint": "embeddings", "inputs": [TEXT]}), lambda: True)  # type: ignore[arg-type]
        worker._answer_embeddings(conn, "e1", embedded)  # type: ignore[arg-type]
        done = next(m for m in conn.sent if isinstance(m, Done))
        assert done.embeddings is not None
        want = engine.embed(server_tokens)
        assert done.usage["prompt_tokens"] == len(server_tokens)
        assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(done.embeddings[0], want, strict=True))
    finally:
        engine.close()
