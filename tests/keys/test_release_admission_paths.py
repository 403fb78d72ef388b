"""A key's admission (its concurrency slot, its place in the model's queue bound) is given back
exactly once on every way a request can end, in-process (the real ASGI application and worker
code around the simulated engine, tests/edge/inproc.py): a key with ``max_concurrent=1`` whose
request ended is admitted again (no leak), and one whose request is still running is not
admitted twice (no double release)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Any

import pytest
from channels.testing import ApplicationCommunicator

from api.errors import engine_unavailable
from keys.credentials import digest_of
from keys.runtime import Key, KeyRuntime, Policy
from scheduler.core.qos import QosClass
from scheduler.link import messages as m
from scheduler.link.transport import JobHandle
from tests.edge.inproc import JSON, MODEL, SimWorker, application, attached, chat_body, request, scope

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-release-once-0123456789"
NAME = "release-once"
POLICY = Policy(name="one", max_class=QosClass.INTERACTIVE, max_concurrent=1)
KEYS = {digest_of(SECRET): Key(id=1, name=NAME, digest=digest_of(SECRET), policy=POLICY)}
AUTH = [*JSON, (b"authorization", f"Bearer {SECRET}".encode())]


def held(rt: KeyRuntime) -> tuple[int, int]:
    """(the key's slots held, places held in the model's queue bound)."""
    return rt.slots.held.get(NAME, 0), sum(rt.in_flight.held.values())


async def settled(rt: KeyRuntime, want: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    for _ in range(500):
        if held(rt) == want:
            break
        await asyncio.sleep(0.01)
    return held(rt)


async def admitted_again(rt: KeyRuntime) -> None:
    """Nothing held once the request ended, and the key's next request is served."""
    assert await settled(rt) == (0, 0)
    reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), AUTH)
    assert reply.status == 200, reply.body
    assert await settled(rt) == (0, 0)


def scripted(link: Any, scripts: list[list[Any]]) -> list[JobHandle]:
    """``link.submit`` answers each submission with the next script's events (no worker)."""
    made: list[JobHandle] = []

    async def submit(**fields: Any) -> JobHandle:
        job_id = uuid.uuid4().hex
        handle = JobHandle(job_id=job_id, submit=m.Submit(id=job_id, **fields))
        for event in scripts[len(made)] if len(made) < len(scripts) else scripts[-1]:
            handle.events.put_nowait(event(job_id))
        made.append(handle)
        return handle

    link.submit = submit
    return made


def accepted(job_id: str) -> Any:
    return m.Accepted(job_id, prompt_tokens=3)


def delta(job_id: str) -> Any:
    return m.Delta(job_id, text="a", tokens=1)


def done(job_id: str) -> Any:
    return m.Done(job_id, finish_reason="length", usage={"prompt_tokens": 3, "completion_tokens": 1})


def error(job_id: str) -> Any:
    return m.Error(job_id, m.ENGINE_ERROR, "boom")


def rejected(job_id: str) -> Any:
    return m.Rejected(job_id, m.CONTEXT_LENGTH_EXCEEDED, "too long", "messages")


# -- requests that end by themselves ------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", chat_body(max_tokens=3)),
        ("/v1/chat/completions", chat_body(max_tokens=3, stream=True)),
        ("/v1/chat/completions", chat_body(max_tokens=3, n=3)),
        ("/v1/chat/completions", chat_body(max_tokens=3, n=3, stream=True)),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": ["a", "b"], "max_tokens": 3}).encode()),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": "a", "max_tokens": 3, "stream": True, "n": 2}).encode()),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": "a", "max_tokens": 3, "echo": True}).encode()),
        ("/v1/embeddings", json.dumps({"model": MODEL, "input": ["a", "b"]}).encode()),
        ("/tokenize", json.dumps({"content": "hi"}).encode()),
    ],
)
async def test_a_request_that_ends_gives_its_keys_places_back_once(path: str, body: bytes) -> None:
    worker = SimWorker()
    async with attached(worker, keys=KEYS) as (link, rt):
        if path == "/v1/embeddings":
            assert link.worker is not None
            link.worker.engine.features = frozenset({*link.worker.engine.features, "embeddings"})
        reply = await request("POST", path, body, AUTH)
        assert reply.status < 500, reply.body
        await admitted_again(rt)


# -- the worker refuses or fails it -------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "script",
    [[rejected], [error], [accepted, error], [accepted, delta, error], [accepted, delta, rejected]],
    ids=["rejected-first", "error-first", "error-after-accepted", "error-mid-stream", "rejected-mid-stream"],
)
async def test_a_job_the_worker_refuses_or_fails_gives_the_places_back(stream: bool, script: list[Any]) -> None:
    async with attached(SimWorker(), keys=KEYS) as (link, rt):
        real = link.submit
        scripted(link, [script])
        reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=3, stream=stream), AUTH)
        assert reply.status in (200, 400, 500), reply.body
        link.submit = real
        await admitted_again(rt)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("failing", [0, 1, 2])
async def test_one_choice_of_several_failing_gives_the_places_back_once(stream: bool, failing: int) -> None:
    async with attached(SimWorker(), keys=KEYS) as (link, rt):
        real = link.submit
        ok = [accepted, delta, done]
        scripts = [ok, ok, ok]
        scripts[failing] = [accepted, delta, error] if failing else [error]
        scripted(link, scripts)
        reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=3, n=3, stream=stream), AUTH)
        assert reply.status in (200, 500), reply.body
        link.submit = real
        await admitted_again(rt)


@pytest.mark.parametrize("nth", [0, 1])
async def test_a_link_lost_at_submit_gives_the_places_back(nth: int) -> None:
    """503 from the link before the first job is submitted, or between two choices'."""
    async with attached(SimWorker(), keys=KEYS) as (link, rt):
        real = link.submit
        calls = 0

        async def lost(**fields: Any) -> JobHandle:
            nonlocal calls
            calls += 1
            if calls > nth:
                raise engine_unavailable("The engine worker is not running.")
            handle: JobHandle = await real(**fields)
            return handle

        link.submit = lost
        reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=3, n=2), AUTH)
        assert reply.status == 503, reply.body
        link.submit = real
        await admitted_again(rt)


async def test_an_exception_between_admission_and_submit_gives_the_places_back() -> None:
    async with attached(SimWorker(), keys=KEYS) as (link, rt):
        real = link.submit

        async def broken(**fields: Any) -> JobHandle:
            raise RuntimeError("a bug before the submit")

        link.submit = broken
        reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=3), AUTH)
        assert reply.status == 500, reply.body
        link.submit = real
        await admitted_again(rt)


# -- the client leaves --------------------------------------------------------------------


@pytest.mark.parametrize("when", ["queued", "first-token", "mid-stream", "after-done"])
@pytest.mark.parametrize("n", [1, 2])
async def test_a_client_that_leaves_gives_the_places_back_once(when: str, n: int) -> None:
    worker = SimWorker(lanes=1, step_sleep_s=0.01)
    async with attached(worker, keys=KEYS) as (_link, rt):
        if when == "queued":
            # another key's long request holds the only lane: this one waits in the queue
            other = asyncio.ensure_future(request("POST", "/v1/chat/completions", chat_body(max_tokens=200), JSON, timeout_s=30))
            for _ in range(500):
                if worker.busy()[0] == 1:
                    break
                await asyncio.sleep(0.01)
        comm = ApplicationCommunicator(application(), scope("POST", "/v1/chat/completions", AUTH))
        max_tokens = 2 if when == "after-done" else 200
        await comm.send_input({"type": "http.request", "body": chat_body(max_tokens=max_tokens, n=n, stream=True), "more_body": False})
        if when == "queued":
            for _ in range(500):
                if worker.busy()[1] >= 1:
                    break
                await asyncio.sleep(0.01)
            assert worker.busy()[1] >= 1  # it waits for the lane
        elif when == "first-token":
            start = await comm.receive_output(10)
            assert start["type"] == "http.response.start"
        else:
            start = await comm.receive_output(10)
            assert start["status"] == 200
            while True:
                message = await comm.receive_output(10)
                body = message.get("body", b"")
                if when == "mid-stream" and b'"content"' in body or not message.get("more_body"):
                    break
        if when != "after-done":
            assert held(rt)[0] == 1
        await comm.send_input({"type": "http.disconnect"})
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await comm.wait(10)
        if when == "queued":
            other.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await other
        await admitted_again(rt)


# -- two at once ----------------------------------------------------------------------------


async def test_a_key_at_its_limit_is_refused_while_its_request_runs_and_served_after() -> None:
    """No double release: while one request runs after another ended (and failed), the key's
    second is refused 429, as the limit says."""
    worker = SimWorker(lanes=2, step_sleep_s=0.01)
    async with attached(worker, keys=KEYS) as (link, rt):
        real = link.submit
        scripted(link, [[accepted, delta, error]])
        reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=3, stream=True), AUTH)
        assert reply.status == 200
        link.submit = real
        assert await settled(rt) == (0, 0)
        comm = ApplicationCommunicator(application(), scope("POST", "/v1/chat/completions", AUTH))
        await comm.send_input({"type": "http.request", "body": chat_body(max_tokens=200, stream=True), "more_body": False})
        start = await comm.receive_output(10)
        assert start["status"] == 200
        assert held(rt) == (1, 1)
        second = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), AUTH)
        assert second.status == 429, second.body
        assert second.json()["error"]["code"] == "concurrency_limit_exceeded"
        assert held(rt) == (1, 1)
        await comm.send_input({"type": "http.disconnect"})
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await comm.wait(10)
        await admitted_again(rt)


# -- a batch's lines, run as its key ------------------------------------------------------


def keyed_batch(n: int, max_tokens: int) -> Any:
    from batches import runner
    from batches.models import Batch, File, Line

    f = File.objects.create(purpose="batch", filename="in.jsonl", bytes=1, content=b"x", owner=NAME)
    b = Batch.objects.create(endpoint="/v1/completions", input_file=f, owner=NAME, total=n)
    body = {"model": MODEL, "prompt": "once upon a time", "max_tokens": max_tokens}
    Line.objects.bulk_create([Line(batch=b, index=i, custom_id=f"c{i}", body=body) for i in range(n)])
    runner.begin(b.id)
    return b


async def test_a_batchs_lines_give_their_keys_places_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from asgiref.sync import sync_to_async

    from batches import runner

    monkeypatch.setattr("activity.writer.submit", lambda _row: None)
    b = await sync_to_async(keyed_batch)(2, 3)
    async with attached(SimWorker(), keys=KEYS) as (_link, rt):
        for _ in range(2):
            assert await asyncio.wait_for(runner.run_next(b.id), 30)
            assert await settled(rt) == (0, 0)
        await admitted_again(rt)


async def test_a_batch_cancelled_while_its_line_runs_gives_the_keys_places_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from asgiref.sync import sync_to_async

    from batches import runner

    monkeypatch.setattr("activity.writer.submit", lambda _row: None)
    monkeypatch.setattr(runner, "POLL_S", 0.02)
    b = await sync_to_async(keyed_batch)(1, 400)
    async with attached(SimWorker(lanes=1, step_sleep_s=0.01), keys=KEYS) as (_link, rt):
        running = asyncio.ensure_future(runner.run_next(b.id))
        assert await settled(rt, (1, 1)) == (1, 1)
        await sync_to_async(runner.cancel)(b.id)
        assert await asyncio.wait_for(running, 30)
        await admitted_again(rt)


async def test_a_batch_line_refused_for_the_keys_running_request_runs_once_it_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """The line's 429 (the key's one slot taken by its interactive request) takes nothing; it
    is served once that request ended, and gives its slot back."""
    from asgiref.sync import sync_to_async

    from batches import runner

    monkeypatch.setattr("activity.writer.submit", lambda _row: None)
    monkeypatch.setattr(runner, "POLL_S", 0.02)
    b = await sync_to_async(keyed_batch)(1, 3)
    async with attached(SimWorker(lanes=2, step_sleep_s=0.01), keys=KEYS) as (_link, rt):
        comm = ApplicationCommunicator(application(), scope("POST", "/v1/chat/completions", AUTH))
        await comm.send_input({"type": "http.request", "body": chat_body(max_tokens=200, stream=True), "more_body": False})
        assert (await comm.receive_output(10))["status"] == 200
        line = asyncio.ensure_future(runner.run_next(b.id))
        await asyncio.sleep(0.2)
        assert held(rt) == (1, 1) and not line.done()  # refused, waiting for its retry
        await comm.send_input({"type": "http.disconnect"})
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await comm.wait(10)
        assert await asyncio.wait_for(line, 30)
        await admitted_again(rt)
    from batches.models import Batch

    done_batch = await Batch.objects.aget(pk=b.id)
    assert done_batch.completed == 1


# -- several models: the router's turn ------------------------------------------------------


@pytest.mark.parametrize("how", ["unavailable", "left-waiting", "served"])
async def test_a_request_at_the_model_router_gives_the_places_back(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    from types import SimpleNamespace

    from scheduler.link.pool import ModelUnavailable
    from tests.edge.inproc import stand_in_pool

    waiting = asyncio.Event()
    links: list[Any] = []

    async def acquire(model: str, _priority: int, _jobs: int) -> Any:
        if how == "unavailable":
            raise ModelUnavailable(model, "The stand-in pool serves nothing.")
        if how == "left-waiting":
            waiting.set()
            await asyncio.Event().wait()
        return links[0], SimpleNamespace(serial_fields=dict), object()

    async with attached(SimWorker(), keys=KEYS) as (link, rt):
        links.append(link)
        stand_in_pool(monkeypatch, acquire)
        if how == "left-waiting":
            comm = ApplicationCommunicator(application(), scope("POST", "/v1/chat/completions", AUTH))
            await comm.send_input({"type": "http.request", "body": chat_body(max_tokens=2), "more_body": False})
            await asyncio.wait_for(waiting.wait(), 10)
            assert held(rt) == (1, 1)
            await comm.send_input({"type": "http.disconnect"})
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await comm.wait(10)
        else:
            reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2, n=2), AUTH)
            assert reply.status == (503 if how == "unavailable" else 200), reply.body
        monkeypatch.undo()
        await admitted_again(rt)


# -- Redis mode: the key's slot counted in Redis (a stand-in limiter) -----------------------


class CountingLimiter:
    """The shared limiter's contract, in memory: slots (name, limit) taken all or none per
    member, given back by member; ``slow`` holds a take (Redis answering late)."""

    def __init__(self) -> None:
        self.members: dict[str, set[str]] = {}
        self.slow = asyncio.Event()
        self.slow.set()
        self.taking = asyncio.Event()

    def count(self, slot: str) -> int:
        return len(self.members.get(slot, set()))

    async def take(self, buckets: list[Any], slots: list[tuple[str, int]], member: str) -> tuple[int, float]:
        self.taking.set()
        await self.slow.wait()
        for j, (name, limit) in enumerate(slots):
            if self.count(name) >= limit:
                return len(buckets) + j + 1, 1.0
        for name, _limit in slots:
            self.members.setdefault(name, set()).add(member)
        return 0, 0.0

    async def release(self, slot: str, member: str) -> None:
        await asyncio.sleep(0)
        self.members.get(slot, set()).discard(member)


@pytest.mark.parametrize("when", ["ends", "fails", "leaves-mid-stream", "leaves-during-take"])
async def test_in_redis_mode_the_keys_slot_is_given_back_once(monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    from django.test import override_settings

    from keys import limits

    limiter = CountingLimiter()
    monkeypatch.setattr(limits, "shared_limiter", lambda url: limiter)
    slot = limits.key_slot(NAME)

    async def settled_shared(want: int) -> int:
        for _ in range(500):
            if limiter.count(slot) == want and sum(rt.in_flight.held.values()) == want:
                break
            await asyncio.sleep(0.01)
        return limiter.count(slot)

    with override_settings(SUPERFLUID_REDIS_URL="redis://127.0.0.1:1/0"):
        async with attached(SimWorker(lanes=2, step_sleep_s=0.01), keys=KEYS) as (link, rt):
            if when in ("ends", "fails"):
                real = link.submit
                if when == "fails":
                    scripted(link, [[accepted, delta, error]])
                reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=3, stream=True), AUTH)
                assert reply.status == 200
                link.submit = real
            else:
                if when == "leaves-during-take":
                    limiter.slow.clear()
                comm = ApplicationCommunicator(application(), scope("POST", "/v1/chat/completions", AUTH))
                await comm.send_input({"type": "http.request", "body": chat_body(max_tokens=200, stream=True), "more_body": False})
                if when == "leaves-during-take":
                    await asyncio.wait_for(limiter.taking.wait(), 10)
                else:
                    assert (await comm.receive_output(10))["status"] == 200
                    assert limiter.count(slot) == 1
                    other = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), AUTH)
                    assert other.status == 429, other.body  # one at a time
                await comm.send_input({"type": "http.disconnect"})
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await comm.wait(10)
                limiter.slow.set()
            assert await settled_shared(0) == 0
            again = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), AUTH)
            assert again.status == 200, again.body
            assert await settled_shared(0) == 0


# -- a double release shows beside a request still running -----------------------------------

TWO_SECRET = "sk-release-twice-0123456789"
TWO = "release-twice"
TWO_KEYS = {digest_of(TWO_SECRET): Key(id=2, name=TWO, digest=digest_of(TWO_SECRET), policy=Policy(name="two", max_class=QosClass.INTERACTIVE, max_concurrent=2))}
TWO_AUTH = [*JSON, (b"authorization", f"Bearer {TWO_SECRET}".encode())]


async def open_stream(headers: list[tuple[bytes, bytes]]) -> ApplicationCommunicator:
    comm = ApplicationCommunicator(application(), scope("POST", "/v1/chat/completions", headers))
    await comm.send_input({"type": "http.request", "body": chat_body(max_tokens=400, stream=True), "more_body": False})
    start = await comm.receive_output(10)
    assert start["status"] == 200, start
    return comm


async def leave(comm: ApplicationCommunicator) -> None:
    await comm.send_input({"type": "http.disconnect"})
    with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
        await comm.wait(10)


@pytest.mark.parametrize("how", ["ends", "fails-mid-stream", "rejected", "leaves", "n-one-fails"])
async def test_a_request_that_ended_beside_another_leaves_that_ones_slot_counted(how: str) -> None:
    """A key of two at once: one stream runs while another request ends (each way); the running
    one still counts, so only one more is admitted beside it."""
    async with attached(SimWorker(lanes=4, step_sleep_s=0.01), keys=TWO_KEYS) as (link, rt):
        running = await open_stream(TWO_AUTH)
        assert rt.slots.held.get(TWO) == 1
        real = link.submit
        if how == "leaves":
            await leave(await open_stream(TWO_AUTH))
        else:
            scripts = {
                "ends": [[accepted, delta, done]],
                "fails-mid-stream": [[accepted, delta, error]],
                "rejected": [[rejected]],
                "n-one-fails": [[accepted, delta, done], [accepted, delta, error]],
            }[how]
            scripted(link, scripts)
            n = 2 if how == "n-one-fails" else 1
            await request("POST", "/v1/chat/completions", chat_body(max_tokens=3, stream=True, n=n), TWO_AUTH)
            link.submit = real
        for _ in range(500):
            if rt.slots.held.get(TWO) == 1:
                break
            await asyncio.sleep(0.01)
        assert rt.slots.held.get(TWO) == 1  # the running stream's, no fewer
        third = await open_stream(TWO_AUTH)
        fourth = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), TWO_AUTH)
        assert fourth.status == 429, fourth.body
        await leave(third)
        await leave(running)
        for _ in range(500):
            if not rt.slots.held.get(TWO):
                break
            await asyncio.sleep(0.01)
        assert rt.slots.held.get(TWO, 0) == 0
