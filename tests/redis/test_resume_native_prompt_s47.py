"""A resumed llama-server ``/completion`` stream (``Last-Event-ID``, Redis mode: its first head
died, the client came back to another) whose prompt was token ids: its closing frame's
``prompt`` is the prompt's text, as the first head's would have been.

Seen: ``"prompt": ""``. The text of a token-id prompt is detokenised when the job is submitted
(NativeCompletionConsumer.run_job); the head that took the stream over never submits it."""

from __future__ import annotations

import json

import pytest

from .conftest import RedisServer
from .test_resume_row import _Resumed

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_resumed_token_id_prompts_closing_frame_has_the_prompts_text(monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer, prefix: str) -> None:
    from channels.testing import HttpCommunicator

    from api.tokenizer import detokenize
    from api.views import vocab_of
    from superfluid_site.asgi import application

    vocab = vocab_of()
    ids = vocab.tokenize("a tale", add_special=False, parse_special=False)
    text = detokenize(vocab, ids)
    assert ids and text.strip() == "a tale"
    resumed = _Resumed(monkeypatch)
    try:
        await resumed.start(redis_server, prefix, 0.005, 40)
        body = json.dumps({"prompt": ids, "n_predict": 40, "stream": True}).encode()
        headers = [(b"content-type", b"application/json"), (b"host", b"127.0.0.1"), (b"last-event-id", f"{resumed.handle.job_id}:3".encode())]
        response = await HttpCommunicator(application, "POST", "/completion", body=body, headers=headers).get_response(timeout=30)
    finally:
        await resumed.stop()
    assert response["status"] == 200, response
    frames = [json.loads(line[6:]) for line in response["body"].decode().splitlines() if line.startswith("data: ")]
    assert frames[-1]["stop"] is True and frames[-1]["prompt"] == text, frames[-1]
