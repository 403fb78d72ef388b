"""The MLX engine writes gpt-oss's channel markers (``<|channel|>``, ``<|message|>``, ``<|start|>``,
``<|constrain|>``) into a reply as text, as llama.cpp does (llama-vocab.cpp makes them
user-defined: "always render these tokens"), and its ``<|end|>`` too (session 52: llama.cpp's
vocabulary makes it user-defined where ``<|return|>`` and ``<|call|>`` are there, and no end of
generation); its other control tokens (``<|return|>``, ``<|call|>``) print nothing. The web side splits a gpt-oss reply's channels by those markers
(api/reasoning.py): without them an MLX gpt-oss reply came as ``analysisThe user says
hi.assistantfinalHello`` in ``content``, its reasoning not split out."""

from __future__ import annotations

import json
from pathlib import Path

from api.reasoning import split_reasoning
from scheduler.engines.hf_vocab import HfVocabulary
from scheduler.engines.mlx import MlxEngine

MARKERS = ["<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|return|>", "<|call|>"]


def _gpt_oss_folder(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=MARKERS)
    tok.train_from_iterator(["analysis final assistant Hello the user says hi"] * 4, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|return|>"}))
    return tmp_path


REPLY = "<|channel|>analysis<|message|>The user says hi.<|end|><|start|>assistant<|channel|>final<|message|>Hello<|return|>"


def _engine_text(vocab: HfVocabulary, ids: list[int]) -> str:
    # the MLX engine's generated text: its token_bytes, without loading a model
    engine = object.__new__(MlxEngine)
    engine._vocab = vocab
    engine._pieces = {}
    return b"".join(engine.token_bytes(t) for t in ids).decode("utf-8")


def test_an_mlx_gpt_oss_reply_keeps_its_channel_markers_and_splits_its_reasoning(tmp_path: Path) -> None:
    vocab = HfVocabulary(_gpt_oss_folder(tmp_path))
    ids = vocab.encode(REPLY, special=True)
    assert {vocab.tok.token_to_id(m) for m in ("<|start|>", "<|channel|>", "<|message|>")} <= set(ids)
    text = _engine_text(vocab, ids)
    assert text == REPLY.replace("<|return|>", "")
    assert split_reasoning(text, "harmony") == ("The user says hi.", "Hello")


def test_the_constrain_marker_is_text_and_other_control_tokens_print_nothing(tmp_path: Path) -> None:
    vocab = HfVocabulary(_gpt_oss_folder(tmp_path))
    piece = {m: vocab.piece(vocab.tok.token_to_id(m), render_special=False) for m in MARKERS}
    assert piece == {"<|start|>": b"<|start|>", "<|channel|>": b"<|channel|>", "<|message|>": b"<|message|>", "<|constrain|>": b"<|constrain|>", "<|end|>": b"<|end|>", "<|return|>": b"", "<|call|>": b""}
