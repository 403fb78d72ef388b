"""A model folder's fast tokenizer (``tokenizer.json`` with its ``tokenizer_config.json``), read
one way for the MLX engine and for the web process's ``/tokenize`` and ``/detokenize``: the same
ids for the same text (BOS added by hand, once, where the vocabulary asks; never EOS, which a
post-processor may add) and each token's raw bytes, so that a character split across tokens
joins up again (a token decoded alone is U+FFFD, or loses a SentencePiece word's space).

Hugging Face ``tokenizers`` only: no MLX, no model weights.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

# gpt-oss's control tokens that llama.cpp writes as text all the same (llama-vocab.cpp: "always
# render these tokens", made user-defined): a reply holds its channel markers as the model sampled
# them, and the web side splits its channels by them (api/reasoning.py)
RENDERED_CONTROL = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")
# llama-vocab.cpp's workaround for gpt-oss's (o200k_harmony) and Solar Open's tokenizers: where a
# vocabulary has <|return|> and <|call|> (or <|calls|> and <|flush|>), its <|end|> ends a message,
# not the generation (gpt-oss writes it after its analysis, then its final answer), and is made
# user-defined, written as text
HARMONY_END = "<|end|>"


def end_is_text(contents: set[str]) -> bool:
    """Whether a vocabulary of these added tokens' texts keeps <|end|> as text (llama.cpp's rule)."""
    calls = "<|call|>" in contents or "<|calls|>" in contents
    return HARMONY_END in contents and calls and ("<|return|>" in contents or "<|flush|>" in contents)


def byte_decoder() -> dict[str, int]:
    """GPT-2's printable-character alphabet for the 256 byte values, inverted."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, codes, strict=True)}


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; ``{}`` when the file is not there."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def bos_once(tokens: list[int], text: str, *, add_special: bool, add_bos: bool, bos_id: int | None, bos_text: str) -> list[int]:
    """``tokens`` of ``text``, after a BOS when the vocabulary asks for one (``add_bos``),
    ``add_special`` allows it and the text does not start with it already (BOS once, never EOS):
    with its text read as the BOS token, not as plain text (``special`` false), where ``<s>`` is
    characters and the BOS still comes first, as llama.cpp adds it."""
    has_bos = bool(bos_text) and text.startswith(bos_text) and tokens[:1] == [bos_id]
    if add_special and add_bos and not has_bos and bos_id is not None:
        return [bos_id, *tokens]
    return tokens


class HfVocabulary:
    """The tokenizer of the model folder ``folder`` (FileNotFoundError without a
    ``tokenizer.json``)."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        tok_file = folder / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"{folder} has no tokenizer.json")
        self.tok = Tokenizer.from_file(str(tok_file))
        tok_json = json.loads(tok_file.read_text(encoding="utf-8"))
        self.config = read_json(folder / "tokenizer_config.json")
        self.vocab_size: int = self.tok.get_vocab_size(with_added_tokens=True)
        self.added = self.tok.get_added_tokens_decoder()
        # the control tokens written as text: gpt-oss's markers, and its <|end|> (end_is_text)
        self.rendered = RENDERED_CONTROL + ((HARMONY_END,) if end_is_text({t.content for t in self.added.values()}) else ())
        self.special = {i for i, t in self.added.items() if t.special and t.content not in self.rendered}
        self.user_defined = {i: t.content for i, t in self.added.items() if i not in self.special}
        self._byte_map = byte_decoder() if '"ByteLevel"' in json.dumps(tok_json.get("decoder") or {}) else {}
        self.bos_text = self._token_text("bos_token")
        self.eos_text = self._token_text("eos_token")
        self.bos_id: int | None = self.tok.token_to_id(self.bos_text) if self.bos_text else None
        self.eos_id: int | None = self.tok.token_to_id(self.eos_text) if self.eos_text else None
        with_special = self.tok.encode("a", add_special_tokens=True).ids
        self.add_bos = bool(self.config.get("add_bos_token", False)) or (
            self.bos_id is not None and with_special[:1] == [self.bos_id]
        )
        self._flag = threading.Lock()  # encode_special_tokens is a flag on the shared tokenizer

    def _token_text(self, name: str) -> str:
        value = self.config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        return str(value) if value else ""

    def encode(self, text: str, *, special: bool) -> list[int]:
        """``text``'s ids, nothing added: special-token text parsed as those tokens when
        ``special``, else as plain text."""
        plain = not special and hasattr(self.tok, "encode_special_tokens")
        with self._flag:
            if plain:
                self.tok.encode_special_tokens = True
            try:
                ids: list[int] = self.tok.encode(text, add_special_tokens=False).ids
            finally:
                if plain:
                    self.tok.encode_special_tokens = False
        return ids

    def tokenize(self, text: str, *, add_special: bool, special: bool) -> list[int]:
        """:meth:`encode`, then BOS as :func:`bos_once` says."""
        ids = self.encode(text, special=special)
        return bos_once(ids, text, add_special=add_special, add_bos=self.add_bos, bos_id=self.bos_id, bos_text=self.bos_text)

    def piece(self, token: int, *, render_special: bool) -> bytes:
        """The raw bytes of ``token``: a control token's text when ``render_special`` (as
        llama.cpp's ``/detokenize``), else nothing (as its generated text); b"" for an unknown id."""
        if token in self.special:
            return self.added[token].content.encode("utf-8") if render_special else b""
        if token in self.user_defined:
            return self.user_defined[token].encode("utf-8")
        text = self.tok.id_to_token(token)
        if text is None:
            return b""
        if self._byte_map:
            return bytes(self._byte_map[c] for c in text if c in self._byte_map)
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            return bytes([int(text[3:5], 16)])  # SentencePiece byte fallback
        return text.replace("\u2581", " ").encode("utf-8")
