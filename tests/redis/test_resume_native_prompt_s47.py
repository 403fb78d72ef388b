"""A resumed llama-server ``/completion`` stream (``Last-Event-ID``, Redis mode: its first head
died, the client came back to another) whose prompt was token ids: its closing frame's
``prompt`` is the prompt's text, as the first head's would have been.

Seen: ``"prompt": ""``. The text of a token-id prompt is detokenised when the job is submitted
(NativeCompletionConsumer.run_job); the head that took the stream over never submits it."""

from __future__ import annotations

import pytest

from .conftest import RedisServer
from .test_resume_row import _Resumed

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_resumed_token_id_prompts_closing_frame_has_the_prompts_text(monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer, prefix: str) -> None:
    from api.tokenizer import detokenize
    from api.views import vocab_of

    vocab = vocab_of()
    ids = vocab.tokenize("a tale", add_special=False, parse_special=False)
    text = detokenize(vocab, ids)
    assert ids and text.strip() == "a tale"
    frames = await _Resumed(monkeypatch).native_frames(redis_server, prefix, ids)
    assert frames[-1]["stop"] is True and frames[-1]["prompt"] == text, frames[-1]
