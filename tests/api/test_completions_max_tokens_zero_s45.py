"""``/v1/completions`` with ``max_tokens: 0``: OpenAI's legacy endpoint takes it (its spec's
minimum is 0), and ``echo: true, logprobs: N, max_tokens: 0`` is how a prompt is scored without
generating anything (lm-eval-harness' older OpenAI model, HELM, perplexity scripts). It was a
400 ``invalid_value`` here. Now the reply is the prompt alone: its text with ``echo``, its scores
with ``logprobs``, ``finish_reason`` ``length``, no completion tokens, and the job takes no lane.
Chat keeps its minimum of 1 (OpenAI's chat has nothing to answer with no token)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.edge.inproc import JSON, MODEL, attached_loop, request
from tests.edge.test_stream_equivalence import ScriptWorker, assemble, script

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def edge() -> Iterator[asyncio.AbstractEventLoop]:
    """The in-process middle layer over the scripted engine (it scores prompts)."""
    with attached_loop(ScriptWorker(lanes=2, lane_ctx=512)) as loop:
        yield loop


def _post(loop: asyncio.AbstractEventLoop, path: str, body: dict[str, Any]) -> Any:
    return loop.run_until_complete(request("POST", path, json.dumps({"model": MODEL, **body}).encode(), JSON, timeout_s=20))


def test_echo_and_logprobs_with_max_tokens_zero_scores_the_prompt_alone(edge: asyncio.AbstractEventLoop) -> None:
    prompt = "Q " + script("never written")
    reply = _post(edge, "/v1/completions", {"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 0})
    assert reply.status == 200, reply.body[:400]
    body = reply.json()
    choice = body["choices"][0]
    assert choice["text"] == prompt and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == prompt  # one entry per prompt token (a byte a token here)
    assert lp["token_logprobs"][0] is None and all(isinstance(x, float) for x in lp["token_logprobs"][1:])
    assert lp["text_offset"] == list(range(len(prompt)))
    assert body["usage"]["prompt_tokens"] == len(prompt.encode()) and body["usage"]["completion_tokens"] == 0

    # streamed: the same reply in pieces, then the usage
    twin = {"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 0, "stream": True, "stream_options": {"include_usage": True}}
    streamed = _post(edge, "/v1/completions", twin)
    assert streamed.status == 200
    got, error = assemble(streamed.sse_data(), False, True, True)
    assert error is None
    assert got["choices"][0]["text"] == prompt and got["choices"][0]["finish_reason"] == "length"
    assert {k: got["choices"][0]["logprobs"][k] for k in ("tokens", "token_logprobs", "text_offset")} == {
        k: lp[k] for k in ("tokens", "token_logprobs", "text_offset")
    }
    assert got["usage"]["completion_tokens"] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_zero_without_echo_is_an_empty_completion(edge: asyncio.AbstractEventLoop, stream: bool) -> None:
    reply = _post(edge, "/v1/completions", {"prompt": ["a " + script("x"), "b " + script("y")], "n": 2, "max_tokens": 0, "stream": stream})
    assert reply.status == 200, reply.body[:400]
    if stream:
        got, error = assemble(reply.sse_data(), False, False, False)
        assert error is None
        choices = [got["choices"][i] for i in sorted(got["choices"])]
    else:
        choices = reply.json()["choices"]
        assert reply.json()["usage"]["completion_tokens"] == 0
    assert [(c["text"], c["finish_reason"]) for c in choices] == [("", "length")] * 4


def test_chat_and_fill_in_the_middle_still_refuse_zero(edge: asyncio.AbstractEventLoop) -> None:
    chat = _post(edge, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0})
    fim = _post(edge, "/v1/completions", {"prompt": "def f(", "suffix": "\n", "max_tokens": 0})
    for reply in (chat, fim):
        assert reply.status == 400 and reply.is_error_object()
        assert (reply.json()["error"]["param"], reply.json()["error"]["code"]) == ("max_tokens", "invalid_value")
