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


def _with_eos(src: Path, out: Path) -> None:
    """A copy of the GGUF ``src`` whose vocabulary asks for an EOS after each text (gguf-py)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(src)
    writer = GGUFWriter(str(out), arch=reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "tokenizer.ggml.add_eos_token"):
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    writer.add_key_value("tokenizer.ggml.add_eos_token", True, GGUFValueType.BOOL)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


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

    gguf = tmp_path / "eos.gguf"
    _with_eos(default_model_path(), gguf)
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
