"""A stream that waits sends keepalives (``serve --sse-keepalive``): queued behind another job, or
stalled mid-reply (a long engine step), it writes the route's keepalive every so often, so that
an idle timeout between the client and this server (nginx's 60 s read timeout, Codex's
``stream_idle_timeout_ms``, an HTTP client's read timeout) does not cut a request that is only
waiting its turn. The replies the clients put together are the same as without them.

In-process: the real ASGI application and worker code around the scripted engine (Qwen 3's real
chat template, tests/edge/templated.py), one lane, so a second request waits for the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from channels.testing import ApplicationCommunicator

from tests.edge.inproc import JSON, MODEL, SimWorker, application, attached_loop, request, scope
from tests.edge.templated import TEMPLATES, TemplateEngine
from tests.edge.test_stream_equivalence import script

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "http://127.0.0.1:8000"
BEAT_S = 0.05
STALL_S = 0.5  # one engine step this long: ten keepalive intervals


STALL = threading.Event()  # set: the engine's next step takes STALL_S


class SlowQwenEngine(TemplateEngine):
    """The scripted engine, each step a few milliseconds; with STALL set, one step STALL_S
    (a stream already under way then waits mid-reply, as behind a long prompt step)."""

    template = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()

    def forward(self, step: Any) -> dict[int, int]:
        time.sleep(0.004)
        if STALL.is_set():
            STALL.clear()
            time.sleep(STALL_S)
        return super().forward(step)


class StallingWorker(SimWorker):
    """One lane of SlowQwenEngine: a second request waits for the first."""

    engine_class = SlowQwenEngine

    def __init__(self) -> None:
        super().__init__(lanes=1, lane_ctx=2048)
        self.stall_next = STALL
        STALL.clear()


@pytest.fixture
def sim() -> StallingWorker:
    return StallingWorker()


@contextlib.contextmanager
def loop_with(sim: StallingWorker, keepalive_s: float) -> Iterator[asyncio.AbstractEventLoop]:
    with attached_loop(sim, SUPERFLUID_COMPLETION_RATE="0", SUPERFLUID_SSE_KEEPALIVE=keepalive_s) as loop:
        yield loop


@pytest.fixture
def loop(sim: StallingWorker) -> Iterator[asyncio.AbstractEventLoop]:
    with loop_with(sim, BEAT_S) as loop:
        yield loop


def behind_a_busy_lane(loop: asyncio.AbstractEventLoop, sim: StallingWorker, call: Any) -> Any:
    """``call()`` (a coroutine) made while another chat holds the one lane for ~0.6 s."""

    async def go() -> Any:
        body = json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "Long " + script("x" * 150)}]}
        ).encode()
        first = asyncio.ensure_future(request("POST", "/v1/chat/completions", body, JSON))
        deadline = time.monotonic() + 10
        while sim.busy()[0] == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert sim.busy()[0] == 1, "the first chat never took the lane"
        out = await call()
        assert (await first).status == 200
        return out

    return loop.run_until_complete(go())


def client_run(call: Any) -> Any:
    async def go() -> Any:
        transport = httpx.ASGITransport(app=application(), client=("127.0.0.1", 50002))
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            return await call(http)

    return go()


def blocks(body: bytes) -> list[str]:
    return [b for b in body.decode().split("\n\n") if b.strip()]


def test_a_queued_chat_stream_sends_comments_while_it_waits_and_the_same_reply(
    loop: asyncio.AbstractEventLoop, sim: StallingWorker
) -> None:
    said = "Hello from behind the queue."
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi " + script(said)}], "stream": True}
    ).encode()
    reply = behind_a_busy_lane(loop, sim, lambda: request("POST", "/v1/chat/completions", body, JSON))
    assert reply.status == 200
    events = blocks(reply.body)
    comments = [i for i, e in enumerate(events) if e.startswith(":")]
    assert len(comments) >= 3 and all(events[i] == ": keepalive" for i in comments), events
    first_text = next(i for i, e in enumerate(events) if e.startswith("data: ") and '"content":"H' in e)
    assert comments[0] < first_text  # sent while it was queued
    chunks = [json.loads(d) for d in reply.sse_data() if d != "[DONE]"]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == said
    assert reply.sse_data()[-1] == "[DONE]"


def test_the_openai_client_reads_a_chat_stream_with_keepalives_as_without(
    loop: asyncio.AbstractEventLoop, sim: StallingWorker
) -> None:
    said = "Streamed through the SDK."

    async def call(http: httpx.AsyncClient) -> str:
        client = openai.AsyncOpenAI(base_url=BASE + "/v1", api_key="unused", http_client=http, max_retries=0)
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi " + script(said)}], stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    assert behind_a_busy_lane(loop, sim, lambda: client_run(call)) == said


def stalled_stream(loop: asyncio.AbstractEventLoop, path: str, body: dict[str, Any], begun: bytes) -> bytes:
    """A stream's bytes as written, read as they come; once a write holds ``begun`` (its reply
    has begun) the engine's next step stalls. (httpx's ASGI transport hands a client the body
    only once the application is done, so the wire is read here.)"""

    async def go() -> bytes:
        comm = ApplicationCommunicator(application(), scope("POST", path, JSON))
        await comm.send_input({"type": "http.request", "body": json.dumps(body).encode(), "more_body": False})
        assert (await comm.receive_output(10))["type"] == "http.response.start"
        writes: list[bytes] = []
        while True:
            message = await comm.receive_output(10)
            writes.append(message.get("body", b""))
            if len(writes) < 3 and begun in writes[-1]:
                STALL.set()
            if not message.get("more_body", False):
                break
        await comm.send_input({"type": "http.disconnect"})
        return b"".join(writes)

    return loop.run_until_complete(go())


def test_a_chat_stream_stalled_mid_reply_sends_comments_between_its_tokens(loop: asyncio.AbstractEventLoop) -> None:
    said = "A reply that stalls in the middle of its text."
    whole = stalled_stream(
        loop,
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi " + script(said)}], "stream": True},
        b'"content":"A',
    )
    first_text = whole.index(b'"content":"A')
    assert whole.count(b": keepalive\n\n", first_text) >= 3, whole
    texts = [
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in whole.decode().split("\n")
        if line.startswith("data: {") and '"choices":[{' in line
    ]
    assert "".join(texts) == said


def test_codex_reads_a_queued_responses_stream_whose_in_progress_events_repeat(
    loop: asyncio.AbstractEventLoop, sim: StallingWorker
) -> None:
    """Codex counts only events against stream_idle_timeout_ms (an SSE comment is not one to
    its parser): the keepalive is response.in_progress again, numbered in sequence, which the
    ``openai`` client's stream reads as OpenAI's own."""
    said = "Done waiting."
    body = json.dumps({"model": MODEL, "input": "Hi " + script(said), "stream": True}).encode()
    reply = behind_a_busy_lane(loop, sim, lambda: request("POST", "/v1/responses", body, JSON))
    wire = [
        (b.split("\n")[0][len("event: ") :], json.loads(b.split("\n")[1][len("data: ") :])) for b in blocks(reply.body)
    ]
    kinds = [k for k, _ in wire]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds.count("response.in_progress") >= 4, kinds
    assert [d["sequence_number"] for _, d in wire] == list(range(len(wire)))
    assert {d["response"]["id"] for _, d in wire if "response" in d} == {wire[0][1]["response"]["id"]}

    async def call(http: httpx.AsyncClient) -> Any:
        client = openai.AsyncOpenAI(base_url=BASE + "/v1", api_key="unused", http_client=http, max_retries=0)
        async with client.responses.stream(model=MODEL, input="Hi " + script(said)) as s:
            kinds = [e.type async for e in s]
            return kinds, await s.get_final_response()

    kinds, final = behind_a_busy_lane(loop, sim, lambda: client_run(call))
    assert kinds.count("response.in_progress") >= 4 and final.output_text == said and final.status == "completed"


def test_a_responses_stream_stalled_mid_reply_repeats_its_output_so_far(loop: asyncio.AbstractEventLoop) -> None:
    said = "The first half, then a stall, then the rest."
    whole = stalled_stream(
        loop,
        "/v1/responses",
        {"model": MODEL, "input": "Hi " + script(said), "stream": True},
        b"response.output_text.delta",
    )
    wire = [json.loads(b.split("\n")[1][len("data: ") :]) for b in blocks(whole)]
    assert [d["sequence_number"] for d in wire] == list(range(len(wire)))
    later = [d for d in wire[2:] if d["type"] == "response.in_progress"]
    assert len(later) >= 3, [d["type"] for d in wire]
    # the output so far: the message item, still in progress, with the text sent before the beat
    (item,) = later[0]["response"]["output"]
    text = item["content"][0]["text"]
    assert item["type"] == "message" and item["status"] == "in_progress" and text and said.startswith(text)
    # and the ``openai`` client puts the same Response together as without the beats
    http = httpx.Client(
        transport=httpx.MockTransport(
            lambda _r: httpx.Response(200, content=whole, headers={"content-type": "text/event-stream"})
        )
    )
    with (
        openai.OpenAI(api_key="unused", base_url=BASE + "/v1", http_client=http, max_retries=0) as client,
        client.responses.stream(model=MODEL, input="x") as s,
    ):
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert (
        kinds.count("response.in_progress") == len(later) + 1
        and final.output_text == said
        and final.status == "completed"
    )


def test_claude_code_reads_a_queued_messages_stream_with_pings(
    loop: asyncio.AbstractEventLoop, sim: StallingWorker
) -> None:
    said = "Pinged while waiting."
    body = json.dumps(
        {
            "model": MODEL,
            "max_tokens": 200,
            "messages": [{"role": "user", "content": "Hi " + script(said)}],
            "stream": True,
        }
    ).encode()
    reply = behind_a_busy_lane(loop, sim, lambda: request("POST", "/v1/messages", body, JSON))
    kinds = [b.split("\n")[0] for b in blocks(reply.body)]
    assert kinds[0] == "event: message_start" and kinds[-1] == "event: message_stop"
    assert kinds.count("event: ping") >= 4, kinds  # the opening's one and the keepalives

    async def call(http: httpx.AsyncClient) -> Any:
        client = anthropic.AsyncAnthropic(base_url=BASE, api_key="unused", http_client=http, max_retries=0)
        async with client.messages.stream(
            model=MODEL, max_tokens=200, messages=[{"role": "user", "content": "Hi " + script(said)}]
        ) as s:
            return await s.get_final_message()

    message = behind_a_busy_lane(loop, sim, lambda: client_run(call))
    assert [b.text for b in message.content if b.type == "text"] == [said] and message.stop_reason == "end_turn"


def test_with_keepalive_0_a_waiting_stream_sends_nothing_extra(sim: StallingWorker) -> None:
    with loop_with(sim, 0) as loop:
        body = json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "Hi " + script("No beats.")}], "stream": True}
        ).encode()
        reply = behind_a_busy_lane(loop, sim, lambda: request("POST", "/v1/chat/completions", body, JSON))
        assert (
            reply.status == 200
            and b": keepalive" not in reply.body
            and not any(e.startswith(":") for e in blocks(reply.body))
        )


@pytest.mark.parametrize("value", ["0.5", "-1", "nan", "inf"])
def test_serve_refuses_a_keepalive_that_cannot_work(value: str) -> None:
    """Below a second a stream would write more keepalives than tokens; a negative, NaN or
    infinite interval is no interval."""
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="--sse-keepalive must be 0"):
        call_command("serve", "--sse-keepalive", value)


def test_a_beat_that_falls_as_an_event_arrives_loses_no_event() -> None:
    """The keepalive cancels the stream's wait on its events and waits again: an event put in
    the queue at the very moment of the beat (the timer and the put in one turn of the loop, in
    either order) is read by the next wait, never dropped. 400 events, each arriving exactly
    when a beat is due."""
    from types import SimpleNamespace

    from api.consumers import GenerationConsumer
    from superfluid_site.serving import ServingConfig, installed

    async def go() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[int] = asyncio.Queue()
        beats = []

        async def send_body(body: bytes, more_body: bool) -> None:
            beats.append(body)

        stream = SimpleNamespace(send_body=send_body, keepalive_event=lambda: b": keepalive\n\n")
        got = []
        for i in range(400):
            loop.call_at(loop.time() + 0.002, queue.put_nowait, i)  # due with the beat (or a hair before or after)
            got.append(await GenerationConsumer.beating(stream, queue.get))  # type: ignore[arg-type]
        return got, len(beats)

    with installed(ServingConfig.from_settings(sse_keepalive=0.002)):
        got, beats = asyncio.run(asyncio.wait_for(go(), 60))  # (an event lost: the next wait never ends)
    assert got == list(range(400))
    assert beats > 0  # some beats did fall on the arrivals
