"""Assistant prefill with the bundled model's own vocabulary and chat template (ChatML): the
worker's prompt is the conversation before the last assistant turn, the generation prompt, and
that turn's text, tokenised as text (the client's ``<|im_end|>`` in it is no end of turn, as in
any message); the web side's count (/v1/chat/completions/input_tokens, /v1/messages/count_tokens)
is the worker's prompt, token for token; and the model's greedy reply goes on from the prefill."""

from __future__ import annotations

import pytest

from api.rendering import count_chat_tokens, render_chat
from api.tokenizer import GgufVocab
from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.llama_cpp import LlamaCppEngine
from scheduler.worker.loop import EngineWorker
from tests.engines.test_contract import _run_worker

pytestmark = pytest.mark.model

PREFILL = 'Sure<|im_end|> {"a":'
MESSAGES = [{"role": "user", "content": "Give me JSON."}, {"role": "assistant", "content": PREFILL}]


def test_the_prompt_ends_with_the_prefill_as_text_and_the_web_counts_it(engine: LlamaCppEngine) -> None:
    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=2048), model_name="m", prepare_in_thread=False)
    wire = {"endpoint": "chat", "messages": MESSAGES, "prefill": True}
    tokens, own, param, _ = worker._prompt_tokens(wire, "")
    assert own == len(tokens) and param == "messages"  # the prefill is the prompt's own
    # (a control token spells nothing: the prefill's "<|im_end|>" here is its text)
    text = b"".join(engine.token_bytes(t) for t in tokens).decode()
    assert text.endswith("\nGive me JSON.\nassistant\n" + PREFILL), text
    (end,) = engine.tokenize("<|im_end|>", add_special=False, special=True)
    vocab = GgufVocab(engine.model_path)
    chat = render_chat(vocab, wire)
    assert chat.text.endswith("<|im_start|>user\nGive me JSON.<|im_end|>\n<|im_start|>assistant\n" + PREFILL), chat.text
    assert tokens.count(end) == chat.text.count("<|im_end|>") - 1  # the turns' ends, not the prefill's text
    assert count_chat_tokens(vocab, chat) == len(tokens)
    turn, *_ = worker._prompt_tokens({"endpoint": "chat", "messages": MESSAGES}, "")  # no prefill: a turn, ended
    assert b"".join(engine.token_bytes(t) for t in turn).decode().endswith(PREFILL + "\nassistant\n")
    assert turn.count(end) == tokens.count(end) + 1


def test_the_models_reply_continues_the_prefill(engine: LlamaCppEngine) -> None:
    """Greedy, the bundled model counts on from where the prefill stopped (asked anew, it would
    begin the count again): the reply is the continuation only."""
    messages = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}, {"role": "assistant", "content": "1, 2, 3,"}]
    request = {"endpoint": "chat", "messages": messages, "prefill": True, "max_tokens": 6, "temperature": 0}
    text, ended = _run_worker(engine, request)
    assert ended[0].type == "done", ended
    assert text.startswith(" 4, 5"), text


def test_a_resumed_prefilled_reply_goes_on_after_the_prefill_and_what_was_sent(engine: LlamaCppEngine) -> None:
    """A job resumed on another worker (Redis mode: its Submit's ``resume_text``, the text sent
    already) has the prefill in its own prompt and the text sent after it, as the model wrote it."""
    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=2048), model_name="m", prepare_in_thread=False)
    wire = {"endpoint": "chat", "messages": MESSAGES, "prefill": True}
    fresh, fresh_own, _, _ = worker._prompt_tokens(wire, "")
    resumed, own, _, _ = worker._prompt_tokens(wire, ' "b"')
    assert own == fresh_own and resumed[:own] == fresh
    assert b"".join(engine.token_bytes(t) for t in resumed[own:]) == b' "b"'
