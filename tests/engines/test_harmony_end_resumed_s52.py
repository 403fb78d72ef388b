"""A resumed gpt-oss reply's ``<|end|>`` is its control token again (session 52 review). llama.cpp
writes gpt-oss's ``<|end|>`` as text (its vocabulary drops it from the ends of generation where
``<|return|>`` and ``<|call|>`` are there), and since 981a01f the MLX engine does too, so a reply
past its analysis holds ``<|end|>`` as text. A reply resumed (after a park, or on another
worker after its own was lost) is tokenised again after the prompt: gpt-oss's markers whose text
the reply holds are their tokens again (``chat.REASONING_FORMAT_TOKENS``), but ``<|end|>`` was
left out, so the resumed model read its analysis's end as the letters "<|end|>"."""

from __future__ import annotations

from typing import Any

from tests.engines.test_lazy_tool_grammar_s48 import _templated_worker

MARKERS = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<|end|>", "<|return|>", "<|call|>")


def _tokenize(text: str, *, add_special: bool = True, special: bool = True, after: int | None = None) -> list[int]:
    """Characters as their code points; with ``special``, each marker as one token (-1 - its index)."""
    out: list[int] = []
    i = 0
    while i < len(text):
        hit = next((m for m in MARKERS if special and text.startswith(m, i)), None)
        if hit is not None:
            out.append(-1 - MARKERS.index(hit))
            i += len(hit)
        else:
            out.append(ord(text[i]))
            i += 1
    return out


def test_a_resumed_gpt_oss_replys_end_is_its_token_again() -> None:
    worker = _templated_worker("gpt-oss-120b.jinja")
    worker.engine.tokenize = _tokenize  # type: ignore[method-assign,assignment]
    assert worker.reasoning_format == "harmony"
    delivered = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hel"
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    tokens, own = worker._chat_tokens(messages, delivered)
    resumed = tokens[own:]
    assert resumed == _tokenize(delivered), resumed
    # (the client's text is still text: a user's "<|end|>" is no control token)
    end = _tokenize("<|end|>")[0]
    quoted, _ = worker._chat_tokens([{"role": "user", "content": "say <|end|>"}])
    plain, _ = worker._chat_tokens([{"role": "user", "content": "say -------"}])
    assert quoted.count(end) == plain.count(end)
