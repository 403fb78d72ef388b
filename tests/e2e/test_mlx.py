"""The real server on the MLX engine (CPU backend here): the bundled SmolLM2 converted to an MLX
model folder, served through the OpenAI API with batching, preemption and cancellation.

The server serves the float32 conversion (MLX's CPU backend multiplies it through BLAS, many
times faster than its quantised kernel; docs/engines.md), and replies are short."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from .server import (
    RunningServer,
    assert_a_disconnect_frees_the_lane,
    assert_streams_batched,
    openai_chat,
    openai_client,
    serving,
    stream_text,
)

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct-mlx"  # the folder's name
QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
START_S = 300.0  # loading mlx-lm (and transformers) on a busy two-core machine is slow


@pytest.fixture(scope="module")
def mlx_server(mlx_float_dir: Path) -> Iterator[RunningServer]:
    with serving("--model", str(mlx_float_dir), "--max-batch", "2", "--ctx-size", "512", timeout_s=START_S) as srv:
        yield srv


def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server.base, timeout_s=300)


def stream_chat(server: RunningServer, messages: list[dict], max_tokens: int) -> tuple[str, str]:
    return openai_chat(server.base, MODEL, messages, max_tokens, timeout_s=300)


def test_a_chat_reply_streams_through_the_openai_client_on_mlx(mlx_server: RunningServer) -> None:
    assert mlx_server.state()["engine"] == "mlx"
    assert [m.id for m in client(mlx_server).models.list()] == [MODEL]
    text, finish = stream_chat(mlx_server, QUESTION, 16)
    assert (text, finish) == ("The capital of France is Paris.", "stop")


def test_concurrent_streams_are_batched_and_all_complete(mlx_server: RunningServer) -> None:
    def ask(i: int) -> tuple[str, str]:
        return stream_chat(mlx_server, [{"role": "user", "content": f"Count to {i + 3}."}], 8)

    assert_streams_batched(mlx_server, 2, ask, interval_s=0.05, idle_s=10)


def test_a_client_disconnect_cancels_its_job_and_frees_the_lane(mlx_server: RunningServer) -> None:
    # the role chunk and two text deltas; the tick in flight ends at the engine's next step
    assert_a_disconnect_frees_the_lane(mlx_server, MODEL, max_tokens=400, lines_before_closing=3, timeout_s=60)


def test_an_interactive_chat_preempts_a_background_job_which_resumes_exactly(mlx_server: RunningServer) -> None:
    """Two background jobs fill both lanes; an interactive chat parks one of them, which comes
    back and ends exactly as the same job run alone (both jobs are the same greedy prompt, so
    whichever is parked, both texts must equal the undisturbed one)."""
    srv = mlx_server

    def agent_body() -> dict:
        return {
            "_path": "/v1/completions", "model": MODEL, "prompt": "Here is a list of fruits:\n1. Apple\n2.",
            "max_tokens": 16, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
        }

    background = {"x-superfluid-qos": "background"}
    undisturbed, _ = stream_text(srv.base, agent_body(), background, timeout_s=300)
    chat: dict[str, str] = {}
    threads: dict[str, threading.Thread] = {}
    other: dict[str, str] = {}
    other_started = threading.Event()

    def run_other() -> None:
        other["text"], _ = stream_text(srv.base, agent_body(), background, on_chunk=lambda n: other_started.set(), timeout_s=300)

    def send_chat(n: int) -> None:
        if n == 4 and "chat" not in threads:
            assert other_started.wait(300)  # both lanes hold a background job
            body = {"_path": "/v1/chat/completions", "model": MODEL, "max_tokens": 4, "stream": True,
                    "messages": [{"role": "user", "content": "Hi!"}]}

            def run() -> None:
                chat["text"], _ = stream_text(srv.base, body, {"x-superfluid-qos": "interactive"}, timeout_s=300)

            threads["chat"] = threading.Thread(target=run)
            threads["chat"].start()

    before = srv.state()["counters"]
    threads["other"] = threading.Thread(target=run_other)
    threads["other"].start()
    preempted, usage = stream_text(srv.base, agent_body(), background, on_chunk=send_chat, timeout_s=300)
    for t in threads.values():
        t.join(300)
    after = srv.state()["counters"]
    assert chat.get("text")
    assert after["preemptions"] - before["preemptions"] == 1
    assert after["parks"] - before["parks"] == 1 and after["resumes"] - before["resumes"] == 1
    assert preempted == undisturbed and other["text"] == undisturbed  # the parked KV came back exactly
    assert usage["completion_tokens"] > 4  # the preemption came mid-stream


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]},
    },
}


def test_structured_output_logprobs_and_a_named_tool_call_on_mlx(mlx_server: RunningServer) -> None:
    """What the MLX engine refused before its sampler had token masks: a json_schema reply
    parses and fits the schema, logprobs come one per token, a named call parses."""
    c = client(mlx_server)
    reply = c.chat.completions.create(
        model=MODEL, max_tokens=40, temperature=0, logprobs=True, top_logprobs=2,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    data = json.loads(reply.choices[0].message.content or "")
    assert set(data) == {"name", "age"} and isinstance(data["age"], int) and 0 <= data["age"] <= 150
    assert reply.choices[0].logprobs is not None and reply.choices[0].logprobs.content is not None
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in entries)  # type: ignore[union-attr]
    call = c.chat.completions.create(
        model=MODEL, max_tokens=80, temperature=0, tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    ).choices[0]
    assert call.finish_reason == "tool_calls" and call.message.tool_calls
    fn = call.message.tool_calls[0].function  # type: ignore[union-attr]
    assert fn.name == "get_weather" and isinstance(json.loads(fn.arguments)["city"], str)
