"""A resumed stream (``Last-Event-ID``, Redis mode) knows its prompt's tokens as its worker
accepted them: the head that took it over read the job's stream from its start, the worker's
Accepted included (its activity row's prompt tokens: tests/redis/test_resume_row.py)."""

from __future__ import annotations

import pytest

from .conftest import RedisServer
from .test_resume_row import _Resumed

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_resumed_native_completion_streams_frames_say_the_prompts_tokens(monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer, prefix: str) -> None:
    """llama-server's /completion streamed, resumed on another head: each frame's
    ``tokens_evaluated`` is the prompt's tokens, as on the first head (it was 0: the resuming
    head never saw the job's Accepted as its own)."""
    resumed = _Resumed(monkeypatch)
    frames = await resumed.native_frames(redis_server, prefix, "a tale")
    accepted = resumed.handle.prompt_tokens
    partial = [f for f in frames if not f.get("stop")]
    assert partial and accepted, (frames, accepted)
    assert {f["tokens_evaluated"] for f in partial} == {accepted}, partial
    assert frames[-1]["stop"] is True and frames[-1]["tokens_evaluated"] == accepted, frames[-1]
