"""The worker's counters after /v1/embeddings, in-process (the real ASGI application and worker
code around the simulated engine, tests/edge/inproc.py): an embeddings request the worker answered
is a finished request whose inputs are its prompt tokens, so ``superfluid_prompt_tokens_total``
("prompt tokens of finished requests", docs/operations.md) counts them, as it counts a
completion's prompt; it counted the request (``requests_total``) but none of its tokens."""

from __future__ import annotations

import json

import pytest

from tests.edge.inproc import JSON, MODEL, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)


async def test_an_embeddings_requests_tokens_count_in_the_workers_prompt_tokens() -> None:
    async with attached(SimWorker()) as (link, _rt):
        engine = link.worker.engine  # type: ignore[attr-defined]
        engine.features = frozenset({"embeddings"})
        engine.embed = lambda tokens: [1.0, 0.0]
        stats = link.worker.stats  # type: ignore[attr-defined]
        before = (stats["requests_total"], stats["prompt_tokens_total"])
        body = json.dumps({"model": MODEL, "input": ["abc", [1, 2, 3, 4]], "encoding_format": "float"}).encode()
        reply = await request("POST", "/v1/embeddings", body, JSON)
        assert reply.status == 200, reply.body
        tokens = reply.json()["usage"]["prompt_tokens"]
        assert tokens == 7  # the simulated engine's tokens are bytes
        assert (stats["requests_total"], stats["prompt_tokens_total"]) == (before[0] + 1, before[1] + tokens)
