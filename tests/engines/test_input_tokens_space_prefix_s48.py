"""/chat/completions/input_tokens counts a chat's tokens in the web process, with the model's
vocabulary read there (api/tokenizer.py), as the llama.cpp engine tokenises the chat: under a
vocabulary that prefixes a space (Llama 2's), each piece after the first is the continuation of
the text before it, but right after a special token (tests/engines/test_chat_space_prefix.py).
Without that, each message and template piece after the first counted a space token more."""

from __future__ import annotations

from typing import Any

import pytest

from api.rendering import RenderedChat, count_chat_tokens
from api.tokenizer import GgufVocab
from scheduler.engines.chat import chat_prompt_tokens, compile_chat_template, render_chat_template
from scheduler.engines.llama_cpp import LlamaCppEngine
from tests.engines.test_chat_space_prefix import AFTER_SPECIAL, LLAMA2, space_prefix  # noqa: F401 (the fixture)

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " Hello."}, {"role": "user", "content": "Bye now"}]


@pytest.mark.parametrize("source", [LLAMA2, AFTER_SPECIAL])
def test_the_web_count_is_the_engines_under_a_space_prefix_vocabulary(space_prefix: LlamaCppEngine, source: str) -> None:  # noqa: F811
    eng = space_prefix
    template = compile_chat_template(source)

    def render(m: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return render_chat_template(template, m, bos_token=eng.bos_text, eos_token=eng.eos_text)

    engine_tokens, _ = chat_prompt_tokens(render, eng.tokenize, MESSAGES, None)
    vocab = GgufVocab(eng.model_path)
    assert count_chat_tokens(vocab, RenderedChat(render(MESSAGES, None), render, MESSAGES, None)) == len(engine_tokens)
