"""gpt-oss's ``<|end|>`` on the MLX engine (session 52). gpt-oss ends each message with
``<|end|>`` (its analysis, then ``<|start|>assistant<|channel|>final...``) and the generation with
``<|return|>`` or ``<|call|>``. llama.cpp's vocabulary drops ``<|end|>`` from its ends of
generation where ``<|return|>`` and ``<|call|>`` are there and writes it as text (llama-vocab.cpp,
its o200k_harmony workaround). The MLX engine took every ``<|end|>`` for an end of generation (it
is Phi-3's), so a gpt-oss reply on MLX stopped after its analysis, with no answer and no call."""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models
from tokenizers.pre_tokenizers import ByteLevel

from scheduler.engines.hf_vocab import HfVocabulary
from scheduler.engines.mlx import ends_of_generation


def _folder(tmp_path: Path, markers: list[str]) -> HfVocabulary:
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in markers])
    tok.save(str(tmp_path / "tokenizer.json"))
    return HfVocabulary(tmp_path)


def test_gpt_osss_end_closes_a_message_not_the_generation_and_is_written(tmp_path: Path) -> None:
    vocab = _folder(tmp_path, ["<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|return|>", "<|call|>", "<|endoftext|>"])
    ids = {t.content: i for i, t in vocab.added.items()}
    assert ends_of_generation(vocab, set()) == {ids["<|return|>"], ids["<|call|>"], ids["<|endoftext|>"]}
    # (named by the model's configuration too, as llama.cpp drops it from its list whatever put it there)
    assert ids["<|end|>"] not in ends_of_generation(vocab, {ids["<|end|>"]})
    assert vocab.piece(ids["<|end|>"], render_special=False) == b"<|end|>"
    assert vocab.piece(ids["<|return|>"], render_special=False) == b""


def test_phi3s_end_still_ends_the_generation_and_prints_nothing(tmp_path: Path) -> None:
    vocab = _folder(tmp_path, ["<|end|>", "<|endoftext|>", "<|user|>", "<|assistant|>"])
    ids = {t.content: i for i, t in vocab.added.items()}
    assert ends_of_generation(vocab, set()) == {ids["<|end|>"], ids["<|endoftext|>"]}
    assert vocab.piece(ids["<|end|>"], render_special=False) == b""
