"""The MLX engine gives tokens the roles llama.cpp's vocabulary gives them (end of generation,
fill-in-the-middle markers, the BOS a prompt starts with) for vocabularies beyond SmolLM2's:
the bundled GGUF with special tokens respelled or its metadata changed, served by llama.cpp
from the file and by MLX from the same file converted (``mlx_convert``)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.model

FILLER = "<jupyter_script>"  # id 15, respelled to keep the header's length (and the tensors' offsets)


def _respelled(gguf: bytes, texts: dict[str, str]) -> bytes:
    """``gguf`` with each of its tokens ``texts`` names respelled, and FILLER lengthened or
    shortened by as much the other way, so the header keeps its size and the tensor data stays
    in place."""
    delta = sum(len(new) - len(old) for old, new in texts.items())
    filler = FILLER[:-1] + "_" * (-delta) + ">" if delta <= 0 else FILLER[: -1 - delta] + ">"
    assert len(filler) - len(FILLER) == -delta and len(filler) > 2
    out = gguf
    for old, new in [*texts.items(), (FILLER, filler)]:
        entry = struct.pack("<Q", len(old)) + old.encode()
        assert out.count(entry) == 1
        out = out.replace(entry, struct.pack("<Q", len(new)) + new.encode(), 1)
    assert len(out) == len(gguf)
    return out


def _roles(engine: Any) -> tuple[list[int], Any, Any]:
    return [t for t in range(engine.vocab_size) if engine.is_eog(t)], engine.fim_tokens(), engine.fim_repo_tokens()


def _both(tmp_path: Path, texts: dict[str, str]) -> tuple[tuple[list[int], Any, Any], tuple[list[int], Any, Any]]:
    """(llama.cpp's, MLX's) end-of-generation ids, FIM markers and repo-level FIM markers for
    the bundled GGUF respelled with ``texts``."""
    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.engines.mlx import MlxEngine
    from scheduler.engines.mlx_convert import convert_gguf
    from scheduler.engines.models import default_model_path

    gguf = tmp_path / "respelled.gguf"
    gguf.write_bytes(_respelled(default_model_path().read_bytes(), texts))
    llama = LlamaCppEngine(gguf, n_lanes=1, lane_ctx=64, adapt_threads=False)
    try:
        want = _roles(llama)
    finally:
        llama.close()
    mlx = MlxEngine(convert_gguf(gguf, tmp_path / "respelled-mlx"), n_lanes=1, lane_ctx=64)
    try:
        assert [mlx.tokenize(new) for new in texts.values()] == [[mlx._tok.token_to_id(new)] for new in texts.values()]
        got = _roles(mlx)
    finally:
        mlx.close()
    return want, got


@pytest.mark.parametrize("text", ["<|end_of_text|>", "<end_of_utterance>", "_<EOT>", "[EOT]"])
def test_a_token_llama_cpp_ends_generation_on_by_its_text_ends_it_on_mlx_too(tmp_path: Path, text: str) -> None:
    """llama.cpp ends generation on tokens spelled <|end_of_text|> (Granite, Llama 3's base
    EOS), <end_of_utterance> (SmolDocling), _<EOT> (CodeLlama) or [EOT] (Kimi-K2) whatever the
    model's EOS is; MLX's list lacked them, so a model that emits one where its config names
    another EOS (a Llama 3 instruct folder without generation_config.json) stopped on llama.cpp
    and ran on, printing nothing for the token, on MLX."""
    want, got = _both(tmp_path, {"<issue_comment>": text})  # id 9
    assert 9 in want[0]  # llama.cpp's own rule, the premise
    assert got == want


@pytest.mark.parametrize(
    "texts",
    [
        {"<reponame>": "<fim-repo>"},  # id 4
        {"<reponame>": "<REPO>"},
        {"<reponame>": "<|fim_repo|>"},
        {"<file_sep>": "<|prefix|>", "<filename>": "<|suffix|>", "<gh_stars>": "<|middle|>"},  # ids 5, 6, 7
    ],
)
def test_fim_markers_llama_cpp_finds_by_their_text_mlx_finds_too(tmp_path: Path, texts: dict[str, str]) -> None:
    """llama.cpp finds the repository-name marker spelled <fim-repo>, <REPO> or <|fim_repo|>
    too (and ends generation on it), and prefix/suffix/middle markers spelled <|prefix|>,
    <|suffix|>, <|middle|>; MLX knew only <|repo_name|> and <reponame>, and not that triplet:
    such a model's POST /infill was refused on MLX (no FIM tokens) or laid out without its
    repository marker, and a reply reaching that marker ran on."""
    want, got = _both(tmp_path, texts)
    assert want[1] is not None or want[2] != (None, None)  # llama.cpp found them: the premise
    assert got == want


def gguf_with_keys(src: Path, out: Path, keys: dict[str, bool | int | str | None]) -> None:
    """A copy of the GGUF ``src`` with its metadata ``keys`` set (a bool as bool, an int as
    uint32, a str as a string) or, for None, left out (gguf-py, as bench/extra_bufts.py)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(str(out), arch=arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in keys:
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    for name, value in keys.items():
        if value is not None:
            kind = GGUFValueType.BOOL if isinstance(value, bool) else GGUFValueType.STRING if isinstance(value, str) else GGUFValueType.UINT32
            writer.add_key_value(name, value, kind)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_end_of_turn_tokens_a_gguf_names_in_its_metadata_end_the_converted_models_replies(tmp_path: Path) -> None:
    """A GGUF may name its end-of-turn and end-of-message tokens by id
    (``tokenizer.ggml.eot_token_id``, ``eom_token_id``) rather than by a text llama.cpp knows;
    llama.cpp ends generation on them. The converter wrote only the EOS into config.json, so the
    converted folder's replies ran on past the end of the turn on MLX."""
    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.engines.mlx import MlxEngine
    from scheduler.engines.mlx_convert import convert_gguf
    from scheduler.engines.models import default_model_path

    gguf = tmp_path / "eot.gguf"
    gguf_with_keys(default_model_path(), gguf, {"tokenizer.ggml.eot_token_id": 9, "tokenizer.ggml.eom_token_id": 10})
    llama = LlamaCppEngine(gguf, n_lanes=1, lane_ctx=64, adapt_threads=False)
    try:
        want = [t for t in range(llama.vocab_size) if llama.is_eog(t)]
    finally:
        llama.close()
    assert {9, 10} <= set(want)  # llama.cpp's own rule, the premise
    mlx = MlxEngine(convert_gguf(gguf, tmp_path / "eot-mlx"), n_lanes=1, lane_ctx=64)
    try:
        assert [t for t in range(mlx.vocab_size) if mlx.is_eog(t)] == want
    finally:
        mlx.close()


@pytest.mark.parametrize("pre", ["llama-bpe", "llama3", "smollm"])
def test_a_prompt_starts_with_the_bos_llama_cpp_adds_for_the_ggufs_pre_tokenizer(tmp_path: Path, pre: str) -> None:
    """A GGUF without ``tokenizer.ggml.add_bos_token`` gets llama.cpp's default for its
    pre-tokenizer: a BOS first for Llama 3's (llama-bpe, llama3), none for GPT-2's. The converter
    wrote add_bos_token false whatever the pre-tokenizer, so such a Llama 3 model's prompts
    reached it without the <|begin_of_text|> llama.cpp puts first."""
    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.engines.mlx import MlxEngine
    from scheduler.engines.mlx_convert import convert_gguf
    from scheduler.engines.models import default_model_path

    gguf = tmp_path / "bos.gguf"
    gguf_with_keys(default_model_path(), gguf, {"tokenizer.ggml.add_bos_token": None, "tokenizer.ggml.pre": pre})
    text = "Hello world, 12345!"
    llama = LlamaCppEngine(gguf, n_lanes=1, lane_ctx=64, adapt_threads=False)
    try:
        want = llama.tokenize(text)
    finally:
        llama.close()
    assert (want[0] == 1) == (pre != "smollm")  # llama.cpp's own rule, the premise
    mlx = MlxEngine(convert_gguf(gguf, tmp_path / "bos-mlx"), n_lanes=1, lane_ctx=64)
    try:
        assert mlx.tokenize(text) == want
    finally:
        mlx.close()
