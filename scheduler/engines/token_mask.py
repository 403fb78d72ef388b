"""Grammar constraints as token masks, for engines that sample in NumPy (MLX): llguidance.

The constraint is the same GBNF the llama.cpp engine gives its grammar sampler
(:mod:`scheduler.engines.grammar`: JSON, a JSON Schema, forced tool calls, a client's own
grammar), converted to llguidance's Lark dialect by llguidance's own ``gbnf_to_lark``, so both
engines enforce one grammar. Why llguidance: docs/engines.md (``bench/token_masks.py``).

A :class:`GrammarMatcher` is one lane's matcher: its state is the tokens it has accepted, so a
lane that is parked and bound again replays its generated tokens into a fresh matcher and
continues exactly where it stopped, as llama.cpp's grammar sampler is replayed.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import numpy as np


class GrammarCompileError(ValueError):
    """A GBNF grammar that llguidance cannot convert or compile."""


# a literal, a character class, a comment, a repetition's bounds (each kept whole), or a rule name
_GBNF_PIECE = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*|\{[^}]*\}|[A-Za-z0-9_-]+')


def _lark_key(name: str) -> str:
    """The name ``gbnf_to_lark`` gives a rule, but for case (``-`` to ``_``, ``fooBar`` to
    ``foo_bar``; a terminal's upper case, another's lower); ``root`` becomes ``start``."""
    return "start" if name == "root" else re.sub(r"([a-z])([A-Z])", r"\1_\2", name.replace("-", "_")).lower()


def _distinct_rule_names(gbnf: str) -> str:
    """``gbnf`` with the rules whose Lark names would be the same renamed apart: ``gbnf_to_lark``
    refuses two rules it renames alike, and JSON Schema grammars have them (a pydantic model's
    ``$defs`` ``Address`` beside its property ``address``; a property named ``start``, the name
    it gives ``root``)."""
    names = list(dict.fromkeys(m.group() for m in _GBNF_PIECE.finditer(gbnf) if m.group()[0] not in '"[#{'))
    if "root" in names:
        names.remove("root")
        names.insert(0, "root")
    owners: set[str] = set()
    renamed: dict[str, str] = {}
    for name in names:
        new, k = name, 1
        while _lark_key(new) in owners:
            k += 1
            new = f"{name}-{k}"
        owners.add(_lark_key(new))
        if new != name:
            renamed[name] = new
    if not renamed:
        return gbnf
    return _GBNF_PIECE.sub(lambda m: renamed.get(m.group(), m.group()), gbnf)


@functools.lru_cache(maxsize=64)
def _lark(gbnf: str) -> str:
    """llguidance's grammar text for a GBNF grammar (root rule ``root``), cached: agents send the
    same schema again and again."""
    import llguidance
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        lark = gbnf_to_lark(_distinct_rule_names(gbnf))
    except Exception as exc:  # the converter's own parse errors, whatever their class
        raise GrammarCompileError(f"the grammar does not parse: {exc}") from None
    return str(llguidance.grammar_from("lark", lark))


class TokenMasks:
    """llguidance's view of one model's vocabulary (built once per engine: about half a second)
    and the grammars compiled against it."""

    def __init__(self, tokenizer_json: Path, n_vocab: int, eos_tokens: list[int]) -> None:
        import llguidance

        self._ll = llguidance
        self.n_vocab = n_vocab
        self._tokenizer = llguidance.LLTokenizer(
            tokenizer_json.read_text(encoding="utf-8"), n_vocab=n_vocab, eos_token=sorted(eos_tokens)
        )

    def check(self, gbnf: str) -> str | None:
        """Why ``gbnf`` cannot be enforced; None if it can."""
        try:
            grammar = _lark(gbnf)
        except GrammarCompileError as exc:
            return str(exc)
        error = self._ll.LLMatcher.validate_grammar(grammar, self._tokenizer)
        return error or None

    def matcher(self, gbnf: str) -> GrammarMatcher:
        grammar = _lark(gbnf)
        matcher = self._ll.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarCompileError(f"the grammar cannot be enforced: {matcher.get_error()}")
        return GrammarMatcher(matcher, self.n_vocab)


class GrammarMatcher:
    """One lane's grammar state: which tokens may come next, and the tokens it has taken."""

    def __init__(self, matcher: Any, n_vocab: int) -> None:
        self._matcher = matcher
        self._n_vocab = n_vocab
        self._words = np.zeros(((n_vocab + 31) // 32,), dtype=np.int32)

    def allowed(self) -> np.ndarray:
        """A boolean mask over the vocabulary of the tokens the grammar allows next (only the
        end-of-generation tokens once the grammar is complete; none once it has failed)."""
        m = self._matcher
        if m.is_error():
            return np.zeros(self._n_vocab, dtype=bool)
        m.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")
        return bits[: self._n_vocab].astype(bool)

    def accept(self, token: int) -> None:
        """Advance past ``token`` (one the mask allowed; anything else puts the matcher in its
        error state, where it allows nothing)."""
        if not self._matcher.is_error() and not self._matcher.is_stopped():
            self._matcher.consume_token(int(token))

    def accept_prefix(self, tokens: list[int]) -> int:
        """Advance past the longest prefix of ``tokens`` the grammar allows (a resumed job's
        history), staying out of the error state; how many tokens that took."""
        if self._matcher.is_error() or self._matcher.is_stopped():
            return 0
        return int(self._matcher.try_consume_tokens([int(t) for t in tokens]))
