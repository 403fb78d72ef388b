"""/v1/embeddings beside the worker's other work, in-process (the real ASGI application and
worker code around the simulated engine, tests/edge/inproc.py), the engine made to embed slowly.
The worker embedded every input of a request on the tick thread, between two steps: with the
bundled model on this machine's CPU one input of 512 tokens took ~7 s and one of 2,048 ~36 s, so
one request of 32 inputs held every other stream of the worker for minutes, and a client that
left did not shorten that by one input. They run on a thread of their own now."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from channels.testing import ApplicationCommunicator

from tests.edge.inproc import JSON, MODEL, SimWorker, application, attached, chat_body, request, scope

pytestmark = pytest.mark.django_db(transaction=True)

EMBED_S = 0.4  # one input's forward, simulated
INPUTS = 8


def slow_embedder(link: object, released: threading.Event | None = None) -> list[float]:
    """The simulated engine made to embed, each input taking EMBED_S until ``released`` is set
    (a test sets it once it has read what it measures: the inputs left then take no time, rather
    than seconds of sleep); the start time of each call."""
    engine = link.worker.engine  # type: ignore[attr-defined]
    engine.features = frozenset({"embeddings"})
    calls: list[float] = []
    gate = released or threading.Event()

    def embed(tokens: list[int]) -> list[float]:
        calls.append(time.monotonic())
        gate.wait(EMBED_S)
        return [1.0, 0.0]

    engine.embed = embed
    return calls


def embeddings_body(n: int = INPUTS) -> bytes:
    return json.dumps({"model": MODEL, "input": [f"text {i}" for i in range(n)], "encoding_format": "float"}).encode()


async def test_a_chat_request_is_not_held_behind_a_whole_embeddings_request() -> None:
    async with attached(SimWorker()) as (link, _rt):
        released = threading.Event()
        calls = slow_embedder(link, released)
        embedding = asyncio.create_task(request("POST", "/v1/embeddings", embeddings_body(), JSON, timeout_s=30))
        while not calls:
            await asyncio.sleep(0.01)
        chat = await request("POST", "/v1/chat/completions", chat_body("hi", max_tokens=4), JSON, timeout_s=30)
        embedded_meanwhile = len(calls)
        released.set()
        assert chat.status == 200 and (await embedding).status == 200
        # the chat's reply came while the embeddings were still being computed, not after all
        assert embedded_meanwhile < INPUTS, "the chat reply waited for the whole embeddings request"


async def test_a_client_that_leaves_stops_its_embeddings_request() -> None:
    async with attached(SimWorker()) as (link, _rt):
        calls = slow_embedder(link)
        comm = ApplicationCommunicator(application(), scope("POST", "/v1/embeddings", JSON))
        await comm.send_input({"type": "http.request", "body": embeddings_body(), "more_body": False})
        while not calls:
            await asyncio.sleep(0.01)
        await comm.send_input({"type": "http.disconnect"})  # the client leaves during the first input
        # A request of the same class after it: the one embeddings thread takes it once it is
        # done with the first (arrival order within a class, and none of that class between two
        # inputs), so its reply comes after the last input the first request had embedded.
        after = await request("POST", "/v1/embeddings", embeddings_body(1), JSON, timeout_s=30)
        assert after.status == 200, after.body
        left = len(calls) - 1
        assert left <= 2, f"{left} of {INPUTS} inputs embedded for a client that left during the first"



async def test_an_interactive_embeddings_request_goes_before_background_ones_queued_before_it() -> None:
    """The embeddings thread took requests in arrival order: a search box's query (interactive)
    waited behind every background batch of documents queued before it. It takes the urgent
    classes first, as the prepare thread does, each class in arrival order."""
    async with attached(SimWorker()) as (link, _rt):
        released = threading.Event()
        calls = slow_embedder(link, released)
        texts: list[bytes] = []
        engine = link.worker.engine  # type: ignore[attr-defined]
        embed = engine.embed

        def noting(tokens: list[int]) -> list[float]:
            texts.append(b"".join(engine.token_bytes(t) for t in tokens))
            return embed(tokens)

        engine.embed = noting

        def body(name: str, n: int) -> bytes:
            return json.dumps({"model": MODEL, "input": [f"{name} {i}" for i in range(n)], "encoding_format": "float"}).encode()

        background = [(b"x-superfluid-qos", b"background"), *JSON]
        first = asyncio.create_task(request("POST", "/v1/embeddings", body("first", 2), background, timeout_s=30))
        while not calls:
            await asyncio.sleep(0.01)
        later = asyncio.create_task(request("POST", "/v1/embeddings", body("later", 2), background, timeout_s=30))
        while len(link.worker.preparing) < 2:  # type: ignore[attr-defined]  # both queued at the worker
            await asyncio.sleep(0.01)
        query = await request("POST", "/v1/embeddings", body("query", 1), [(b"x-superfluid-qos", b"interactive"), *JSON], timeout_s=30)
        released.set()
        assert query.status == 200 and (await first).status == 200 and (await later).status == 200
        order = [next(w for w in (b"first", b"later", b"query") if w in t) for t in texts]
        assert order.index(b"query") < order.index(b"later"), order


async def test_an_interactive_embeddings_request_waits_for_one_input_of_a_background_request_in_flight() -> None:
    """The embeddings thread embedded a request's every input before it looked at its queue
    again: a search box's query that arrived during a background request of documents waited for
    all of them (seconds each for long inputs). Between two inputs of a request of the other
    classes it now embeds and answers the interactive and completion requests queued meanwhile."""
    async with attached(SimWorker()) as (link, _rt):
        released = threading.Event()
        calls = slow_embedder(link, released)
        finished: list[str] = []

        async def embeddings(name: str, n: int, qos: bytes) -> int:
            body = json.dumps({"model": MODEL, "input": [f"{name} {i}" for i in range(n)], "encoding_format": "float"}).encode()
            reply = await request("POST", "/v1/embeddings", body, [(b"x-superfluid-qos", qos), *JSON], timeout_s=30)
            finished.append(name)
            return reply.status

        documents = asyncio.create_task(embeddings("documents", INPUTS, b"background"))
        while not calls:
            await asyncio.sleep(0.01)
        assert await embeddings("query", 1, b"interactive") == 200
        embedded_meanwhile = len(calls) - 1  # the query's own input among them
        released.set()
        assert await documents == 200
        assert finished == ["query", "documents"]
        assert embedded_meanwhile <= 2, f"the query waited for {embedded_meanwhile} of the documents' {INPUTS} inputs"
