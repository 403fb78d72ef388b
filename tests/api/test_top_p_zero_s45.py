"""``top_p: 0`` is in OpenAI's range (its spec: a number from 0 to 1) and clients send it for a
deterministic reply (guidance, test harnesses pinning ``temperature=0, top_p=0``); it was a 400
``invalid_value`` here. It keeps only the most probable token, as OpenAI takes it and as
llama.cpp's top-p sampler does at 0 (the token that crosses p stays: the first)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from scheduler.core.types import SamplingParams
from scheduler.engines.sampling import LaneSampler
from tests.edge.inproc import JSON, MODEL, SimWorker, attached_loop, chat_body, request


@pytest.fixture
def edge() -> Iterator[asyncio.AbstractEventLoop]:
    with attached_loop(SimWorker()) as loop:
        yield loop


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_top_p_zero_is_served_on_both_endpoints(edge: asyncio.AbstractEventLoop, path: str, stream: bool) -> None:
    if path.endswith("chat/completions"):
        body: dict[str, Any] = json.loads(chat_body("hi"))
    else:
        body = {"model": MODEL, "prompt": "hi"}
    body.update(top_p=0, temperature=0, max_tokens=4, stream=stream)
    reply = edge.run_until_complete(request("POST", path, json.dumps(body).encode(), JSON))
    assert reply.status == 200, reply.body[:400]
    if stream:
        assert reply.sse_data()[-1] == "[DONE]"
        assert not any("error" in json.loads(d) for d in reply.sse_data()[:-1])
    else:
        assert reply.json()["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("value", [-0.01, 1.01])
def test_top_p_outside_0_to_1_is_still_refused_naming_it(edge: asyncio.AbstractEventLoop, value: float) -> None:
    reply = edge.run_until_complete(request("POST", "/v1/chat/completions", chat_body("hi", top_p=value), JSON))
    assert reply.status == 400 and reply.is_error_object()
    error = reply.json()["error"]
    assert (error["param"], error["code"], error["type"]) == ("top_p", "invalid_value", "invalid_request_error")


def test_top_p_zero_keeps_only_the_most_probable_token_on_the_numpy_chain() -> None:
    """The MLX engine's sampler: at any temperature, top_p 0 draws the argmax (what llama.cpp's
    top-p sampler keeps at 0), not an error or an empty candidate set."""
    logits = np.array([1.0, 3.0, 2.5, -1.0, 0.5], dtype=np.float32)
    sampler = LaneSampler(SamplingParams(temperature=2.0, top_p=0.0, seed=3))
    assert {sampler.sample(logits) for _ in range(50)} == {1}


@pytest.mark.model
def test_top_p_zero_is_greedy_on_llama_cpp() -> None:
    """On the real engine (the bundled SmolLM2): hot sampling with top_p 0 writes the greedy
    continuation."""
    from contextlib import closing

    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.engines.models import default_model_path
    from testkit.engine_driver import GREEDY, chat, generate

    with closing(LlamaCppEngine(default_model_path(), n_lanes=2, lane_ctx=512)) as engine:
        prompt = chat(engine, "Write a haiku about the sea.")
        greedy = generate(engine, 0, prompt, GREEDY, 12)
        hot = SamplingParams(temperature=1.5, top_p=0.0, seed=11)
        assert generate(engine, 1, prompt, hot, 12) == greedy
