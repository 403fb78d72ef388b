"""The served model's vocabulary in the web process, for ``/tokenize`` and ``/detokenize``.

A GGUF file is opened vocabulary-only (llama.cpp reads the tokenizer metadata, not the weights),
once, on first use, so these routes never wait behind generation in the worker. An MLX model
folder uses its ``tokenizer.json`` through Hugging Face ``tokenizers``. Token ids and text are
the same the worker uses: special tokens written in the text are parsed as such.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Protocol


class Vocab(Protocol):
    n_vocab: int

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...

    def piece(self, token: int) -> bytes: ...

    def template_parts(self) -> tuple[str | None, str, str]: ...


class GgufVocab:
    def __init__(self, path: Path) -> None:
        import llama_cpp

        self._L = L = llama_cpp
        L.llama_backend_init()
        params = L.llama_model_default_params()
        params.vocab_only = True
        self._model = L.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise RuntimeError(f"could not read the vocabulary of {path}")
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self._vocab))
        self.add_bos = bool(L.llama_vocab_get_add_bos(self._vocab))
        self.bos = int(L.llama_vocab_bos(self._vocab))
        self.eos = int(L.llama_vocab_eos(self._vocab))

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        size = len(data) + 8
        while True:
            buf = (self._L.llama_token * size)()
            # add_special=False to llama_tokenize: BOS alone is added below, as the engine does
            n = self._L.llama_tokenize(self._vocab, data, len(data), buf, size, False, parse_special)
            if n >= 0:
                break
            size = -n
        tokens = list(buf[:n])
        if add_special and self.add_bos and self.bos >= 0 and tokens[:1] != [self.bos]:
            tokens.insert(0, self.bos)
        return tokens

    def continued(self, text: str, special: bool, after: int) -> list[int] | None:
        """``text``'s tokens as the continuation of earlier text ending in token ``after``, as
        the llama.cpp engine tokenises a chat's pieces (its ``tokenize(after=)``): without the
        space prefix a vocabulary gives the start of each text (Llama 2's) where raw text came
        before; None where ``text`` is tokenised on its own."""
        from scheduler.engines.chat import continued_tokens, prefixes_space

        if getattr(self, "_space_prefix", None) is None:
            self._space_prefix = prefixes_space(lambda t: self.tokenize(t, add_special=False, parse_special=False), self.piece)
        L = self._L
        split_out = L.LLAMA_TOKEN_ATTR_CONTROL | L.LLAMA_TOKEN_ATTR_USER_DEFINED | L.LLAMA_TOKEN_ATTR_UNKNOWN
        if not text or not self._space_prefix or L.llama_vocab_get_attr(self._vocab, after) & split_out:
            return None
        return continued_tokens(lambda t: self.tokenize(t, add_special=False, parse_special=special), self.piece, text)

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = self._L.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._L.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        return ctypes.string_at(buf, max(n, 0))


    def template_parts(self) -> tuple[str | None, str, str]:
        """(the chat template, BOS text, EOS text) as the llama.cpp engine reads them
        (scheduler/engines/llama_cpp.py): the model's template, else its architecture's
        built-in one; None: ChatML."""
        from scheduler.engines.llama_cpp import gguf_chat_template

        def text(token: int) -> str:
            return self.piece(token).decode("utf-8", "replace") if token >= 0 else ""

        return gguf_chat_template(self._model), text(self.bos), text(self.eos)


class HfVocab:
    """A model folder's ``tokenizer.json``, read as the MLX engine reads it
    (:class:`scheduler.engines.hf_vocab.HfVocabulary`); special tokens print as their text, as
    llama.cpp's ``/detokenize`` prints them."""

    def __init__(self, folder: Path) -> None:
        from scheduler.engines.hf_vocab import HfVocabulary

        self._vocab = HfVocabulary(folder)
        self._folder = folder
        self.n_vocab = self._vocab.vocab_size

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return self._vocab.tokenize(text, add_special=add_special, special=parse_special)

    def piece(self, token: int) -> bytes:
        return self._vocab.piece(token, render_special=True)

    def template_parts(self) -> tuple[str | None, str, str]:
        """(the chat template, BOS text, EOS text) as the MLX engine reads them; None: ChatML."""
        from scheduler.engines.mlx import _read_chat_template

        return _read_chat_template(self._folder, self._vocab.config), self._vocab.bos_text, self._vocab.eos_text


_lock = threading.Lock()
_loaded: dict[str, Vocab] = {}


def vocab_for(path: str | Path) -> Vocab:
    """The vocabulary of the model at ``path`` (loaded once per process)."""
    key = str(path)
    with _lock:
        vocab = _loaded.get(key)
        if vocab is None:
            p = Path(path)
            vocab = HfVocab(p) if p.is_dir() else GgufVocab(p)
            _loaded[key] = vocab
        return vocab


def detokenize(vocab: Vocab, tokens: list[int]) -> str:
    """The text of ``tokens``; ValueError for an id outside the vocabulary (llama.cpp's piece
    lookup aborts the process on one)."""
    if any(not 0 <= t < vocab.n_vocab for t in tokens):
        raise ValueError(f"a token id outside this vocabulary (0 to {vocab.n_vocab - 1})")
    return b"".join(vocab.piece(t) for t in tokens).decode("utf-8", "replace")
