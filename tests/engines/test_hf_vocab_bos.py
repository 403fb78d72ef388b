"""BOS once: a text that begins with BOS's text gets no second BOS only when that text was read as
the BOS token. Read as plain text (``parse_special`` false), ``<s>`` is three characters and the
BOS the vocabulary asks for still comes first, as llama-server's ``/tokenize`` gives it."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.tokenizer import HfVocab
from tests.api.test_tokenizer import _folder


@pytest.mark.parametrize("byte_level", [True, False], ids=["byte-level", "sentencepiece"])
def test_bos_texts_read_as_plain_text_still_get_the_bos_token(tmp_path: Path, byte_level: bool) -> None:
    vocab = HfVocab(_folder(tmp_path, byte_level=byte_level))
    plain = vocab.tokenize("<s>hello", add_special=False, parse_special=False)
    assert 0 not in plain
    assert vocab.tokenize("<s>hello", add_special=True, parse_special=False) == [0, *plain]
    # read as the token, it is the BOS: not added again
    assert vocab.tokenize("<s>hello", add_special=True, parse_special=True).count(0) == 1
