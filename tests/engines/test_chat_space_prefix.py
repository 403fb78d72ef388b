"""Chat prompts under a SentencePiece vocabulary that prefixes a space (``add_space_prefix``:
Llama 2's, Mistral v0.1's and v0.2's GGUFs). llama.cpp's tokenizer gives every text it is handed
separately a leading space piece, ``add_special`` or not, and so does it to raw text right after a
special token. ``chat_prompt_tokens`` tokenises each content and each template piece after it on
its own (to keep the client's text plain); each piece after the first is tokenised as the
continuation of the text before it (``tokenize(after=)``), so the prompt spells what the whole
text does (``[INST] Hi [/INST] Hello.``, as llama-server, not ``[INST]  Hi  [/INST]  Hello.``),
with the space llama.cpp gives a text that follows a special token kept.

Here Gemma 3's GGUF with its ``add_space_prefix`` flag set stands in for such a vocabulary. The
MLX engine's Hugging Face tokenizers do the same under a Metaspace pre-tokenizer or a Prepend
normalizer (Llama 2's and Mistral's ``tokenizer.json``); after a special token as the tokenizer
says (prepend_scheme "first": not there)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from scheduler.engines.chat import chat_prompt_tokens, compile_chat_template, render_chat_template
from scheduler.engines.llama_cpp import LlamaCppEngine
from scheduler.engines.models import gemma_model_path

pytestmark = pytest.mark.model

# Llama 2's turns (its template, without the system block)
LLAMA2 = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}{{ '[INST] ' + m.content + ' [/INST]' }}"
    "{% else %}{{ ' ' + m.content + eos_token }}{% endif %}{% endfor %}"
)


@pytest.fixture(scope="module")
def space_prefix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppEngine]:
    import gguf

    path = tmp_path_factory.mktemp("gguf") / "space-prefix.gguf"
    shutil.copyfile(gemma_model_path(), path)
    reader = gguf.GGUFReader(path)
    field = reader.fields["tokenizer.ggml.add_space_prefix"]
    offset = field.parts[field.data[0]].ctypes.data - reader.data.ctypes.data
    del field, reader  # the memory map, before the file is written
    with Path(path).open("r+b") as f:
        f.seek(offset)
        f.write(b"\x01")
    eng = LlamaCppEngine(str(path), n_lanes=1, lane_ctx=512)
    with closing(eng):
        yield eng


def _split_and_whole(eng: Any, source: str, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """(the prompt tokenised piece by piece, as chat_prompt_tokens does; the whole rendered text
    tokenised at once, as llama-server does) for ``messages`` under the template ``source``."""
    template = compile_chat_template(source)

    def render(m: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return render_chat_template(template, m, bos_token=eng.bos_text, eos_token=eng.eos_text)

    tokens, _ = chat_prompt_tokens(render, eng.tokenize, messages, None)
    return tokens, eng.tokenize(render(messages, None))


def test_a_prompt_split_at_the_contents_spells_the_rendered_text_under_a_space_prefix_vocabulary(space_prefix: LlamaCppEngine) -> None:
    eng = space_prefix
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    tokens, whole = _split_and_whole(eng, LLAMA2, messages)
    assert b"".join(map(eng.token_bytes, whole)) == b" [INST] Hi [/INST] Hello. [INST] Bye [/INST]"  # as llama-server
    assert b"".join(map(eng.token_bytes, tokens)) == b"".join(map(eng.token_bytes, whole))


# a content and a template piece right after a special token: llama.cpp gives each the space
AFTER_SPECIAL = "{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + m.content + '<end_of_turn>' }}{% endfor %}<start_of_turn>"


def test_a_piece_right_after_a_special_token_keeps_its_space_prefix(space_prefix: LlamaCppEngine) -> None:
    eng = space_prefix
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    tokens, whole = _split_and_whole(eng, AFTER_SPECIAL, messages)
    assert b"".join(map(eng.token_bytes, whole)) == b" Hi Hello."  # control tokens spell nothing
    assert tokens == whole


def _mlx_text_engine(folder: Path, scheme: str) -> Any:
    """An MLX engine's text side (its vocabulary, no model) over a SentencePiece-style
    ``tokenizer.json`` that prefixes a space: a Metaspace pre-tokenizer with ``scheme``, or
    ("prepend") the Prepend normalizer of Llama 2's and Mistral's Hugging Face tokenizers."""
    import json

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from scheduler.engines.mlx import MlxEngine

    vocab = {"<s>": 0, "</s>": 1, **{f"<0x{b:02X}>": 2 + b for b in range(256)}}
    for piece in ["\u2581", "H", "i", "Hi", "\u2581Hi", "\u2581[", "[", "INST", "]", "\u2581Bye", "Bye", "/"]:
        vocab[piece] = len(vocab)
    merges = [("H", "i"), ("\u2581", "Hi"), ("\u2581", "[")]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
    tok.add_special_tokens(["<s>", "</s>"])
    if scheme == "prepend":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}))
    eng = MlxEngine.__new__(MlxEngine)
    eng.model_path, eng._config, eng._closed = folder, {}, False
    eng._setup_text()
    return eng


@pytest.mark.parametrize("scheme", ["first", "always", "prepend"])
def test_the_mlx_engine_spells_the_rendered_text_under_a_space_prefix_tokenizer(tmp_path: Path, scheme: str) -> None:
    eng = _mlx_text_engine(tmp_path, scheme)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    tokens, whole = _split_and_whole(eng, LLAMA2, messages)
    # "first" gives the space to the text's start alone (here <s>), "always" and Prepend to the
    # text after each special token too
    spelt = b"[INST] Hi [/INST] Hello.[INST] Bye [/INST]" if scheme == "first" else b" [INST] Hi [/INST] Hello. [INST] Bye [/INST]"
    assert b"".join(map(eng.token_bytes, whole)) == spelt
    assert b"".join(map(eng.token_bytes, tokens)) == b"".join(map(eng.token_bytes, whole))


@pytest.mark.parametrize("scheme", ["first", "always", "prepend"])
def test_the_mlx_engine_gives_a_piece_right_after_a_special_token_the_space_its_tokenizer_does(tmp_path: Path, scheme: str) -> None:
    eng = _mlx_text_engine(tmp_path, scheme)
    template = compile_chat_template("{% for m in messages %}{{ '<s>' + m.content + '</s>' }}{% endfor %}")
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Bye"}]

    def render(m: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return render_chat_template(template, m, bos_token=eng.bos_text, eos_token=eng.eos_text)

    tokens, _ = chat_prompt_tokens(render, eng.tokenize, messages, None)
    whole = eng.tokenize(render(messages, None))
    assert b"".join(map(eng.token_bytes, whole)) == (b"HiBye" if scheme == "first" else b" Hi Bye")
    assert tokens == whole
