"""The web process's vocabulary for a model folder (``tokenizer.json``, the MLX engine's): the
ids and bytes the worker uses, so /detokenize and an echoed token-id prompt read right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api.tokenizer import HfVocab, detokenize


def _folder(tmp_path: Path, *, byte_level: bool, post_processor: bool = True, **config: object) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if byte_level:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<s>", "</s>"])
        tok.train_from_iterator(["hello world", "hello there world"] * 4, trainer)
    else:  # SentencePiece-style: "\u2581" for a space, <0xNN> byte fallback for what is not in it
        vocab = {"<s>": 0, "</s>": 1, **{f"<0x{b:02X}>": 2 + b for b in range(256)}}
        for piece in ["\u2581", "h", "e", "l", "o", "w", "r", "d", "ll", "\u2581w", "\u2581wo", "llo"]:
            vocab[piece] = len(vocab)
        merges = [("l", "l"), ("\u2581", "w"), ("\u2581w", "o"), ("ll", "o")]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
        tok.add_special_tokens(["<s>", "</s>"])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    # a post-processor that adds BOS and EOS: the engine adds BOS alone, by hand
    if post_processor:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 1)])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", **config}))
    return tmp_path


@pytest.mark.parametrize("byte_level", [True, False], ids=["byte-level", "sentencepiece"])
def test_detokenize_joins_characters_split_across_tokens_and_keeps_word_spaces(tmp_path: Path, byte_level: bool) -> None:
    vocab = HfVocab(_folder(tmp_path, byte_level=byte_level))
    text = "héllo 😀 world"
    ids = vocab.tokenize(text, add_special=False, parse_special=True)
    assert len(ids) > 4  # the emoji is several tokens here
    assert detokenize(vocab, ids).strip() == text


def test_tokenize_adds_bos_once_and_never_eos_as_the_engine_does(tmp_path: Path) -> None:
    vocab = HfVocab(_folder(tmp_path, byte_level=True))
    plain = vocab.tokenize("hello", add_special=False, parse_special=True)
    assert vocab.tokenize("hello", add_special=True, parse_special=True) == [0, *plain]
    assert vocab.tokenize("<s>hello", add_special=True, parse_special=True) == [0, *plain]  # written BOS: once
    assert 0 not in vocab.tokenize("<s>hello", add_special=False, parse_special=False)  # plain text then


def test_a_vocabulary_whose_config_asks_for_bos_gets_it_without_a_post_processor(tmp_path: Path) -> None:
    # tokenizer_config.json's add_bos_token: the worker adds BOS then, so /tokenize must too
    vocab = HfVocab(_folder(tmp_path, byte_level=True, post_processor=False, add_bos_token=True))
    plain = vocab.tokenize("hello", add_special=False, parse_special=True)
    assert vocab.tokenize("hello", add_special=True, parse_special=True) == [0, *plain]
