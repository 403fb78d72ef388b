"""/v1/embeddings reviewed for what a client (the ``openai`` package, LangChain, LlamaIndex) or a
hostile one could notice: one request must never affect another, and a failure is an error
reply, never a hang.

- An engine failure that is not an ``EngineError`` (a bug, a ctypes or numpy error) raised out
  of the embeddings thread and ended it: that request hung, and so did every embeddings request
  after it (their Submits were queued to a thread that no longer ran), until the worker
  restarted. It is now that request's 500, as the prepare thread makes one of a job it cannot
  build.
- An embeddings request of an urgent class (interactive, completion: a key's class or
  ``x-superfluid-qos``) aborted the engine's prompt step in flight on arrival, as a chat of that
  class does to start at once; but an embeddings request takes no lane, so the prefill work of
  other requests was thrown away for nothing (and redone), once per such request. Its answer now
  stops the tick after the step in flight, as an urgent job refused once prepared does.

The in-process middle layer (tests/edge/inproc.py) around the simulated engine, and the real
model for the engine's own part.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from typing import Any

import pytest

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import SimEngine
from scheduler.link.messages import Submit
from scheduler.worker.loop import EngineWorker, Prepared
from tests.edge.inproc import JSON, MODEL, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)


def body(value: object, **extra: Any) -> bytes:
    return json.dumps({"model": MODEL, "input": value, "encoding_format": "float", **extra}).encode()


# -- an engine failure fails its own request, not the embeddings thread ------------------------


async def test_an_engine_failure_while_embedding_is_that_requests_500_and_the_next_request_is_answered() -> None:
    async with attached(SimWorker()) as (link, _rt):
        engine = link.worker.engine
        engine.features = frozenset({"embeddings"})

        def embed(tokens: list[int]) -> list[float]:
            if bytes(tokens) == b"boom":
                raise RuntimeError("an engine bug")
            return [float(len(tokens)), 0.0]

        engine.embed = embed
        failed = await request("POST", "/v1/embeddings", body(["fine", "boom"]), JSON, timeout_s=10)
        assert failed.status == 500 and failed.is_error_object(), failed.body[:300]
        assert failed.json()["error"]["type"] == "server_error"
        # the thread embeds on: this request, and one of the same inputs as the failed one's first
        after = await request("POST", "/v1/embeddings", body(["fine", "abc"]), JSON, timeout_s=10)
        assert after.status == 200, after.body[:300]
        assert [d["embedding"] for d in after.json()["data"]] == [[4.0, 0.0], [3.0, 0.0]]


# -- an urgent embeddings request aborts no one's prompt step ---------------------------------


class Abortable(SimEngine):
    """The simulator with llama.cpp's abort hook (noting each call) and embeddings."""

    features = frozenset({"embeddings"})

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.features = frozenset({"embeddings"})
        self.aborts = 0

    def abort_step(self, serial: int | None = None) -> None:
        self.aborts += 1

    def embed(self, tokens: list[int]) -> list[float]:
        return [1.0, 0.0]


class _Conn:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def queue(self, message: Any) -> None:
        self.sent.append(message)


@pytest.mark.parametrize(("qos", "urgent"), [(0, True), (1, True), (2, False), (3, False)])
def test_an_urgent_embeddings_request_aborts_no_step_and_its_answer_stops_the_tick_after_its_step(qos: int, urgent: bool) -> None:
    engine = Abortable(n_lanes=2, lane_ctx=64)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=64), model_name="sim", prepare_in_thread=True)
    chat = Submit("chat", {"endpoint": "completions", "prompt": "x", "max_tokens": 3}, qos=qos)
    worker._on_message(chat)
    assert engine.aborts == int(urgent)  # the premise: a chat of this class aborts the step in flight
    engine.aborts = 0
    worker.interrupt.clear()
    embeddings = Submit("emb", {"endpoint": "embeddings", "model": "sim", "inputs": ["hello", "world"]}, qos=qos)
    worker._on_message(embeddings)  # as the link's reader thread sees it arrive
    assert engine.aborts == 0 and not worker.interrupt.is_set(), "an embeddings request stopped the step in flight on arrival"
    worker.handle(_Conn(), embeddings)  # type: ignore[arg-type]
    _conn, prepared = worker.inbox.get(timeout=10)
    assert isinstance(prepared, Prepared) and prepared.embedded is not None
    assert prepared.embedded[1] == 10
    # its answer is ready: an urgent one's leaves after the step in flight (nothing aborted)
    assert engine.aborts == 0 and worker.interrupt.is_set() is urgent


async def test_an_interactive_embeddings_request_through_the_api_aborts_no_step() -> None:
    async with attached(SimWorker()) as (link, _rt):
        engine = link.worker.engine
        engine.features = frozenset({"embeddings"})
        engine.embed = lambda tokens: [1.0, 0.0]
        aborts: list[object] = []
        engine.abort_step = lambda serial=None: aborts.append(serial)
        interactive = [*JSON, (b"x-superfluid-qos", b"interactive")]
        reply = await request("POST", "/v1/embeddings", body(["one", "two"]), interactive)
        assert reply.status == 200, reply.body[:300]
        assert aborts == []
        chat = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode()
        assert (await request("POST", "/v1/completions", chat, interactive)).status == 200
        assert aborts  # the premise: an interactive completion does abort it (on arrival, once prepared)


# -- checked and found right: a worker lost during embeddings ---------------------------------


async def test_a_worker_lost_while_embedding_answers_the_client_from_its_replacement() -> None:
    made: list[EngineWorker] = []
    dying = threading.Event()

    class CrashingFirst(SimWorker):
        def make_worker(self) -> EngineWorker:
            worker = super().make_worker()
            engine = worker.engine
            engine.features = frozenset({"embeddings"})  # type: ignore[misc]
            first = not made
            made.append(worker)
            if first:
                tick = worker.run_tick

                def run_tick() -> bool:
                    if crash.is_set():
                        dying.set()
                        raise RuntimeError("simulated worker crash")
                    return tick()

                worker.run_tick = run_tick  # type: ignore[method-assign]

            def embed(tokens: list[int]) -> list[float]:
                if first:  # the worker dies while this input is being embedded
                    crash.set()
                    assert dying.wait(10)
                return [float(len(tokens)), 1.0]

            engine.embed = embed  # type: ignore[attr-defined]
            return worker

    crash = threading.Event()
    async with attached(CrashingFirst()) as (link, _rt):
        reply = await request("POST", "/v1/embeddings", body(["abc", "de"]), JSON, timeout_s=20)
        assert reply.status == 200, reply.body[:300]
        assert [d["embedding"] for d in reply.json()["data"]] == [[3.0, 1.0], [2.0, 1.0]]
        assert link.restarts == 1 and len(made) == 2


# -- checked and found right, with the real model: vectors, usage, lengths, a generation beside -----

CTX = 128


class RealWorker(SimWorker):
    """The in-process worker around the real llama.cpp engine and the bundled model."""

    def __init__(self) -> None:
        super().__init__(lanes=2, lane_ctx=CTX)
        self.engines: list[Any] = []

    def make_worker(self) -> EngineWorker:
        from scheduler.engines.llama_cpp import LlamaCppEngine
        from scheduler.engines.models import default_model_path

        engine = LlamaCppEngine(default_model_path(), n_lanes=2, lane_ctx=CTX, adapt_threads=False, n_threads=2)
        self.engines.append(engine)
        return EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=CTX), model_name=MODEL, prepare_in_thread=True)


@pytest.mark.model
async def test_real_vectors_are_stable_normalised_counted_and_a_generation_beside_them_is_unchanged() -> None:
    import base64

    import numpy as np

    sim = RealWorker()
    try:
        async with attached(sim) as (_link, _rt):
            engine = sim.engines[0]
            texts = ["The cat sat on the mat.", "Quarterly revenue grew.", "The cat sat on the mat."]
            reply = await request("POST", "/v1/embeddings", body(texts), JSON, timeout_s=120)
            assert reply.status == 200, reply.body[:300]
            data = reply.json()["data"]
            assert [d["index"] for d in data] == [0, 1, 2]
            vectors = [d["embedding"] for d in data]
            assert vectors[0] == vectors[2] != vectors[1]
            assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-6) for v in vectors)
            usage = reply.json()["usage"]
            assert usage["prompt_tokens"] == usage["total_tokens"] == sum(len(engine.embedding_tokens(t)) for t in texts)
            again = await request("POST", "/v1/embeddings", body(texts[0], encoding_format="base64"), JSON, timeout_s=120)
            decoded = np.frombuffer(base64.b64decode(again.json()["data"][0]["embedding"]), dtype="<f4")
            assert decoded.tolist() == np.asarray(vectors[0], dtype="<f4").tolist()  # across requests, as the client decodes it

            # a text of exactly a lane's context in tokens is embedded; one token more is a 400
            fits = " cat" * CTX
            while len(engine.embedding_tokens(fits)) > CTX:
                fits = fits[: -len(" cat")]
            assert len(engine.embedding_tokens(fits)) == CTX and len(engine.embedding_tokens(fits + " cat")) == CTX + 1
            assert (await request("POST", "/v1/embeddings", body(fits), JSON, timeout_s=120)).status == 200
            over = await request("POST", "/v1/embeddings", body(fits + " cat"), JSON, timeout_s=120)
            assert over.status == 400 and (over.json()["error"]["code"], over.json()["error"]["param"]) == ("context_length_exceeded", "input")

            # a greedy generation alone, then with an embeddings request computed beside its steps
            gen = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}).encode()
            alone = await request("POST", "/v1/completions", gen, JSON, timeout_s=120)
            stepping, embedding = threading.Event(), threading.Event()
            execute, embed = engine.execute, engine.embed

            def execute_beside(plan: Any, should_stop: Any) -> Any:
                stepping.set()
                embedding.wait(10)  # its steps run while the inputs are being embedded
                return execute(plan, should_stop)

            def embed_beside(tokens: list[int]) -> list[float]:
                embedding.set()
                stepping.wait(10)
                vector: list[float] = embed(tokens)
                return vector

            engine.execute, engine.embed = execute_beside, embed_beside
            many = [f"Some text about topic number {i}, said at length." * 3 for i in range(8)]
            embedded = asyncio.create_task(request("POST", "/v1/embeddings", body(many), JSON, timeout_s=120))
            beside = await request("POST", "/v1/completions", gen, JSON, timeout_s=120)
            assert stepping.is_set() and embedding.is_set()
            assert beside.json()["choices"][0]["text"] == alone.json()["choices"][0]["text"]
            engine.execute, engine.embed = execute, embed
            first = (await embedded).json()["data"]
            assert first == (await request("POST", "/v1/embeddings", body(many), JSON, timeout_s=120)).json()["data"]
    finally:
        for engine in sim.engines:
            engine.close()
