"""A resumed stream (``Last-Event-ID``, Redis mode) knows its prompt's tokens as its worker
accepted them: the head that took it over read the job's stream from its start, the worker's
Accepted included (its activity row's prompt tokens: tests/redis/test_resume_row.py)."""

from __future__ import annotations

import json

import pytest

from .conftest import RedisServer
from .test_resume_row import _Resumed

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_resumed_native_completion_streams_frames_say_the_prompts_tokens(monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer, prefix: str) -> None:
    """llama-server's /completion streamed, resumed on another head: each frame's
    ``tokens_evaluated`` is the prompt's tokens, as on the first head (it was 0: the resuming
    head never saw the job's Accepted as its own)."""
    from channels.testing import HttpCommunicator

    from superfluid_site.asgi import application

    resumed = _Resumed(monkeypatch)
    try:
        await resumed.start(redis_server, prefix, 0.005, 40)
        accepted = resumed.handle.prompt_tokens
        body = json.dumps({"prompt": "a tale", "n_predict": 40, "stream": True}).encode()
        headers = [(b"content-type", b"application/json"), (b"host", b"127.0.0.1"), (b"last-event-id", f"{resumed.handle.job_id}:3".encode())]
        response = await HttpCommunicator(application, "POST", "/completion", body=body, headers=headers).get_response(timeout=30)
    finally:
        await resumed.stop()
    assert response["status"] == 200, response
    frames = [json.loads(line[6:]) for line in response["body"].decode().splitlines() if line.startswith("data: ")]
    partial = [f for f in frames if not f.get("stop")]
    assert partial and accepted, (frames, accepted)
    assert {f["tokens_evaluated"] for f in partial} == {accepted}, partial
    assert frames[-1]["stop"] is True and frames[-1]["tokens_evaluated"] == accepted, frames[-1]
