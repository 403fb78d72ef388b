"""The MLX engine's grammar masks (scheduler/engines/token_mask.py) let a special token stand for
its text, as llama.cpp's grammar sampler reads every token as its text.

llguidance takes an added token that looks like a tag (``<tool_call>``: Qwen's is added with
``special: false``, GLM's as special) for a special token, which no text in a grammar matches.
So ``tool_choice`` auto's grammar, which allows ``<tool_call>`` where a call opens, masked the
one token Qwen and GLM open their calls with, and a forced call's grammar allowed the tag only
spelled in pieces: on MLX a Qwen model's tool calls in ``auto`` were masked away. Checked on a
vocabulary built here (every byte a token, the tags added as Qwen's tokenizer.json adds them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("llguidance")

from scheduler.engines.grammar import lazy_tool_grammar, tool_grammar  # noqa: E402
from scheduler.engines.token_mask import TokenMasks  # noqa: E402

TAGS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> tuple[TokenMasks, dict[str, int], int, object]:
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel

    bytes_vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=bytes_vocab, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TAGS])  # (as Qwen's tokenizer.json)
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True)])
    path = tmp_path_factory.mktemp("vocab") / "tokenizer.json"
    path.write_text(tok.to_str())
    ids = {tag: tok.token_to_id(tag) for tag in TAGS}
    eos = tok.token_to_id("<|im_end|>")
    return TokenMasks(path, tok.get_vocab_size(), [eos]), ids, eos, tok


def spell(tok: object, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids  # type: ignore[attr-defined, no-any-return]


def test_tool_choice_auto_allows_the_token_a_call_opens_with_and_holds_the_call(vocab: tuple[TokenMasks, dict[str, int], int, object]) -> None:
    masks, ids, eos, tok = vocab
    m = masks.matcher(lazy_tool_grammar([WEATHER], False) or "")
    assert m.allowed()[ids["<tool_call>"]]  # (it was masked: the model could not open a call)
    for t in spell(tok, "Let me check."):
        m.accept(t)
    assert m.allowed()[ids["<tool_call>"]]
    m.accept(ids["<tool_call>"])
    assert not m.allowed()[ids["<tool_call>"]] and not m.allowed()[ids["</tool_call>"]]
    for t in spell(tok, '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'):
        assert m.allowed()[t]
        m.accept(t)
    assert m.allowed()[ids["</tool_call>"]]
    m.accept(ids["</tool_call>"])
    assert m.allowed()[eos]
    # a tag the grammar does not write stays masked (as before: only the grammar's own tags are text)
    assert not masks.matcher(lazy_tool_grammar([WEATHER], False) or "").allowed()[ids["<think>"]]


def test_a_forced_call_takes_the_tag_token_or_the_tag_spelled(vocab: tuple[TokenMasks, dict[str, int], int, object]) -> None:
    masks, ids, eos, tok = vocab
    grammar = tool_grammar([WEATHER], "required", False) or ""
    call = '\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n'
    for opening in ([ids["<tool_call>"]], spell(tok, "<tool_call>")):
        m = masks.matcher(grammar)
        for t in [*opening, *spell(tok, call), ids["</tool_call>"]]:
            assert m.allowed()[t], t
            m.accept(t)
        assert m.allowed()[eos]


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(0, 40), text=st.sampled_from(["", "Sure. ", "<tool_call", "I'll <tool_call>"]))
def test_a_history_with_tag_tokens_replays_to_where_it_was(vocab: tuple[TokenMasks, dict[str, int], int, object], cut: int, text: str) -> None:
    """A lane parked and bound again replays its tokens (accept_prefix): a tag token counts as
    one token, taken whole or not at all, and the matcher goes on as the one that never
    stopped."""
    masks, ids, eos, tok = vocab
    grammar = lazy_tool_grammar([WEATHER], False) or ""
    history = [*spell(tok, text), ids["<tool_call>"], *spell(tok, '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'), ids["</tool_call>"]]
    live = masks.matcher(grammar)
    taken = 0
    for t in history:
        if not live.allowed()[t]:
            break
        live.accept(t)
        taken += 1
    replayed = masks.matcher(grammar)
    assert replayed.accept_prefix(history[:cut]) == min(cut, taken)
    again = masks.matcher(grammar)
    again.accept_prefix(history[: min(cut, taken)])
    fresh = masks.matcher(grammar)
    for t in history[: min(cut, taken)]:
        fresh.accept(t)
    assert (again.allowed() == fresh.allowed()).all()


def test_a_real_tokenizer_json_with_no_added_tags_is_unchanged(tmp_path: Path) -> None:
    """A vocabulary whose specials are only ends of generation maps nothing."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel

    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True)])
    path = tmp_path / "tokenizer.json"
    path.write_text(tok.to_str())
    assert json.loads(path.read_text())["added_tokens"]
    masks = TokenMasks(path, tok.get_vocab_size(), [tok.token_to_id("<|im_end|>")])
    assert masks._specials == {}
