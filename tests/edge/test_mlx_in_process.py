"""The MLX engine behind the real ASGI application and worker code, in-process (tests/edge/inproc.py):
the bundled SmolLM2 converted to an MLX model folder, loaded and wrapped in its worker as
``runengine`` does for ``serve --model <folder> --max-batch 2 --ctx-size 512``, and served
through the OpenAI API with batching, preemption and cancellation.

These ran on a real server of their own (tests/e2e/test_mlx.py): nothing they assert needs the
process boundary, which the real-server tests on llama.cpp cover. The engine serves the float32
conversion (MLX's CPU backend multiplies it through BLAS, many times faster than its quantised
kernel; docs/engines.md), and replies are short."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from channels.testing import ApplicationCommunicator

from scheduler.worker.loop import EngineWorker
from tests.e2e.server import stream_line

from .inproc import CLIENT, HOST, JSON, SimWorker, application, attached, request, scope

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

MODEL = "SmolLM2-135M-Instruct-mlx"  # the folder's name
FLAGS = ("--max-batch", "2", "--ctx-size", "512")
QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
WAIT_S = 300.0  # a failsafe for a reply on a busy two-core machine, not a measure


class MlxWorker(SimWorker):
    """SimWorker's counterpart on the real MLX engine: each worker the in-process transport makes
    loads the folder and wraps it as ``runengine --model <folder> --max-batch 2 --ctx-size 512``
    does (its own parser and functions), on the real clock. Each test loads its own (about 0.4 s
    once mlx-lm is imported): the transport and its worker live on the test's event loop."""

    def __init__(self, folder: Path) -> None:
        super().__init__(lanes=2, lane_ctx=512)
        self.folder = folder
        self.engines: list[Any] = []

    def make_worker(self) -> EngineWorker:
        from scheduler.management.commands.runengine import Command, engine_worker, load_configured_engine
        from scheduler.management.options import resolve_model, scheduler_config

        # a link flag is required; the in-process transport is this worker's link
        options = vars(Command().create_parser("manage.py", "runengine").parse_args(["--model", str(self.folder), *FLAGS, "--link-fd", "3"]))
        config = scheduler_config(options)
        model = resolve_model(options)
        engine = load_configured_engine(options, config, model)
        self.engines.append(engine)
        return engine_worker(engine, config, options, model)

    def close(self) -> None:
        """What runengine does once its worker has stopped (the weights go at once, not at some
        later garbage collection)."""
        while self.engines:
            self.engines.pop().close()


@pytest.fixture
def mlx(mlx_float_dir: Path) -> Iterator[MlxWorker]:
    worker = MlxWorker(mlx_float_dir)
    yield worker
    worker.close()


async def state() -> dict[str, Any]:
    """The worker's latest snapshot as the web side serves it (/v1/internal/state)."""
    reply = await request("GET", "/v1/internal/state")
    assert reply.status == 200, reply.body
    return reply.json()  # type: ignore[no-any-return]


async def wait_until(condition: Callable[[], Awaitable[bool]], limit_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not await condition():
        assert loop.time() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.02)


async def has_state() -> bool:
    return (await request("GET", "/v1/internal/state")).status != 503


@contextlib.asynccontextmanager
async def serving(worker: MlxWorker) -> AsyncIterator[Any]:
    """attached(), once the worker's first snapshot has reached the web side (as the harness
    waits for /v1/internal/state before a real server counts as started)."""
    async with attached(worker) as (link, rt):
        await wait_until(has_state, 30)
        yield link, rt


@contextlib.asynccontextmanager
async def openai_client() -> AsyncIterator[openai.AsyncOpenAI]:
    """The ``openai`` client (no retries), its HTTP carried to the ASGI application in-process:
    httpx's ASGITransport hands the client each whole reply, a stream as all its events."""
    transport = httpx.ASGITransport(app=application(), client=CLIENT)
    base = f"http://{HOST.decode()}/v1"
    async with httpx.AsyncClient(transport=transport) as http, openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=WAIT_S, http_client=http) as c:
        yield c


async def stream_chat(c: openai.AsyncOpenAI, messages: list[dict[str, str]], max_tokens: int) -> tuple[str, str]:
    """(text, finish_reason) of a greedy chat streamed through the ``openai`` client."""
    parts, finish = [], ""
    stream = await c.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0, stream=True)  # type: ignore[arg-type]
    async for chunk in stream:  # type: ignore[union-attr]
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    return "".join(parts), finish


async def stream_text(path: str, body: dict[str, Any], qos: str, on_chunk: Callable[[int], Awaitable[None]] | None = None) -> tuple[str, dict[str, Any]]:
    """(text, final usage) of a streamed completion or chat on ``path``, read as it comes;
    ``await on_chunk(n)`` after each delta. No error frame may arrive."""
    comm = ApplicationCommunicator(application(), scope("POST", path, [*JSON, (b"x-superfluid-qos", qos.encode())]))
    await comm.send_input({"type": "http.request", "body": json.dumps(body).encode(), "more_body": False})
    start = await comm.receive_output(WAIT_S)
    assert start["type"] == "http.response.start" and start["status"] == 200, start
    parts: list[str] = []
    usage: dict[str, Any] = {}
    pending = b""
    while True:
        message = await comm.receive_output(WAIT_S)
        assert message["type"] == "http.response.body", message
        pending += message.get("body", b"")
        *lines, pending = pending.split(b"\n")
        for line in lines:
            pieces, usage = stream_line(line, usage)
            for piece in pieces:
                parts.append(piece)
                if on_chunk is not None:
                    await on_chunk(len(parts))
        if not message.get("more_body", False):
            break
    await comm.send_input({"type": "http.disconnect"})
    with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
        await comm.wait(10)
    return "".join(parts), usage


async def lanes_free() -> bool:
    return bool((await state())["lanes_active"] == 0)


async def test_a_chat_reply_streams_through_the_openai_client_on_mlx(mlx: MlxWorker) -> None:
    async with serving(mlx), openai_client() as c:
        assert (await state())["engine"] == "mlx"  # runengine's auto choice for an MLX folder
        assert [m.id async for m in c.models.list()] == [MODEL]
        text, finish = await stream_chat(c, QUESTION, 16)
        assert (text, finish) == ("The capital of France is Paris.", "stop")


async def test_concurrent_streams_are_batched_and_all_complete(mlx: MlxWorker) -> None:
    """Two chats at once both hold a lane in one tick and both end normally; every lane is free
    again afterwards."""
    async with serving(mlx), openai_client() as c:
        results = await asyncio.gather(*(stream_chat(c, [{"role": "user", "content": f"Count to {i + 3}."}], 8) for i in range(2)))
        assert (await state())["stats"]["peak_lanes_active"] == 2
        assert all(text and finish in ("stop", "length") for text, finish in results), results
        await wait_until(lanes_free, 10)


async def test_a_client_disconnect_cancels_its_job_and_frees_the_lane(mlx: MlxWorker) -> None:
    """A long streamed chat holds one lane; the client leaves after the role chunk and two text
    deltas; its job is cancelled (the tick in flight ends at the engine's next step) and its lane
    freed, long before its 400 tokens could have been generated."""
    async with serving(mlx):
        assert await lanes_free()
        before = (await state())["counters"]
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 400, "ignore_eos": True, "stream": True}
        comm = ApplicationCommunicator(application(), scope("POST", "/v1/chat/completions", JSON))
        await comm.send_input({"type": "http.request", "body": json.dumps(body).encode(), "more_body": False})
        start = await comm.receive_output(WAIT_S)
        assert start["status"] == 200, start
        received = b""
        while received.count(b"data: ") < 3:
            message = await comm.receive_output(WAIT_S)
            assert message.get("more_body", False), received  # not the stream's end
            received += message.get("body", b"")
        assert (await state())["lanes_active"] == 1
        await comm.send_input({"type": "http.disconnect"})
        await comm.wait(60)  # the consumer ends (a TimeoutError here: it hangs)
        await wait_until(lanes_free, 60)
        after = (await state())["counters"]
        assert after["cancelled"] - before["cancelled"] == 1


async def test_an_interactive_chat_preempts_a_background_job_which_resumes_exactly(mlx: MlxWorker) -> None:
    """Two background jobs fill both lanes; an interactive chat parks one of them, which comes
    back and ends exactly as the same job run alone (both jobs are the same greedy prompt, so
    whichever is parked, both texts must equal the undisturbed one)."""
    agent = {
        "model": MODEL, "prompt": "Here is a list of fruits:\n1. Apple\n2.", "max_tokens": 16, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    async with serving(mlx):
        undisturbed, _ = await stream_text("/v1/completions", agent, "background")
        chat: dict[str, asyncio.Task[tuple[str, dict[str, Any]]]] = {}
        other_started = asyncio.Event()

        async def other_chunk(n: int) -> None:
            other_started.set()

        async def send_chat(n: int) -> None:
            if n == 4 and "chat" not in chat:
                await asyncio.wait_for(other_started.wait(), WAIT_S)  # both lanes hold a background job
                body = {"model": MODEL, "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "Hi!"}]}
                chat["chat"] = asyncio.create_task(stream_text("/v1/chat/completions", body, "interactive"))

        before = (await state())["counters"]
        other = asyncio.create_task(stream_text("/v1/completions", agent, "background", other_chunk))
        preempted, usage = await stream_text("/v1/completions", agent, "background", send_chat)
        other_text, _ = await other
        chat_text, _ = await chat["chat"]
        await wait_until(lanes_free, 10)  # the snapshot after the last job's end has arrived
        after = (await state())["counters"]
        assert chat_text
        assert after["preemptions"] - before["preemptions"] == 1
        assert after["parks"] - before["parks"] == 1 and after["resumes"] - before["resumes"] == 1
        assert preempted == undisturbed and other_text == undisturbed  # the parked KV came back exactly
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


async def test_structured_output_logprobs_and_a_named_tool_call_on_mlx(mlx: MlxWorker) -> None:
    """What the MLX engine refused before its sampler had token masks: a json_schema reply
    parses and fits the schema, logprobs come one per token, a named call parses."""
    async with serving(mlx), openai_client() as c:
        reply = await c.chat.completions.create(
            model=MODEL, max_tokens=40, temperature=0, logprobs=True, top_logprobs=2,
            messages=[{"role": "user", "content": "Describe a person as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        )  # fmt: skip
        data = json.loads(reply.choices[0].message.content or "")
        assert set(data) == {"name", "age"} and isinstance(data["age"], int) and 0 <= data["age"] <= 150
        assert reply.choices[0].logprobs is not None and reply.choices[0].logprobs.content is not None
        entries = reply.choices[0].logprobs.content
        assert reply.usage is not None and len(entries) == reply.usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in entries)
        call = (
            await c.chat.completions.create(  # type: ignore[call-overload]
                model=MODEL, max_tokens=80, temperature=0, tools=[WEATHER],
                tool_choice={"type": "function", "function": {"name": "get_weather"}},
                messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            )  # fmt: skip
        ).choices[0]
        assert call.finish_reason == "tool_calls" and call.message.tool_calls
        fn = call.message.tool_calls[0].function
        assert fn.name == "get_weather" and isinstance(json.loads(fn.arguments)["city"], str)
