"""A client that goes away at any moment of its request leaves nothing behind: the whole
in-process path (tests/edge/inproc.py: the ASGI application, admission, the link, the worker's
loop and the simulated engine) with the client's disconnect swept over the turns of the event
loop after its body arrived, from before admission to after its last byte, as
tests/redis/test_cancel_kept.py sweeps the Redis calls.

After each drop, what a user would notice: its key's or address's place is free (the next
request, the same client's, is admitted), the router's lane is given back, the link holds no
job for it, the worker runs nothing for nobody, and its activity row says what happened (499 or
200 with ``client_disconnected``; a plain 200 when the whole answer had gone out)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import ApplicationCommunicator
from django.test import override_settings

from activity import writer as activity_writer
from activity.models import ActivityEntry

from .inproc import JSON, MODEL, SimWorker, application, attached, chat_body, request, scope

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sf-sweep-0123456789abcdef"
KEYED = [*JSON, (b"authorization", f"Bearer {SECRET}".encode())]
# the first turns one at a time, then ever wider steps, until a whole answer went out
LAST_TURN = 50_000  # only a bound on a hang: every case answers in far fewer

CASES: dict[str, tuple[str, bytes]] = {
    "chat": ("/v1/chat/completions", chat_body(max_tokens=6)),
    # streams long enough (48 tokens, a millisecond each) that a drop after the first token
    # lands mid-way even on a loaded machine whose loop stalls for tens of milliseconds
    "chat-stream": ("/v1/chat/completions", chat_body(max_tokens=48, stream=True)),
    "chat-n2": ("/v1/chat/completions", chat_body(max_tokens=6, n=2)),
    "chat-n2-stream": ("/v1/chat/completions", chat_body(max_tokens=48, n=2, stream=True)),
    "completions-2-prompts-stream": ("/v1/completions", json.dumps({"model": MODEL, "prompt": ["a", "b"], "max_tokens": 48, "stream": True}).encode()),
    "embeddings": ("/v1/embeddings", json.dumps({"model": MODEL, "input": ["one", "two"]}).encode()),
}


def slow_sim(lanes: int = 2) -> SimWorker:
    """A millisecond a step: a stream spans many turns of the loop, so some drops land mid-way."""
    return SimWorker(lanes=lanes, step_sleep_s=0.001)


async def until(condition: Callable[[], object], what: Callable[[], object], limit_s: float = 10.0, pause_s: float = 0.002) -> None:
    """Wait for ``condition``; ``limit_s`` only bounds a hang (``what`` says where it stood)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not condition():
        assert loop.time() < deadline, what()
        await asyncio.sleep(pause_s)


def stage(comm: ApplicationCommunicator) -> str:
    """How far the answer got to the client: "before" its status, "mid" body, or "done"."""
    out = list(comm.output_queue._queue)  # type: ignore[attr-defined]
    if not out:
        return "before"
    assert out[0]["type"] == "http.response.start" and out[0]["status"] == 200, out[0]  # never a 429: its place was free
    return "done" if any(m["type"] == "http.response.body" and not m.get("more_body") for m in out) else "mid"


async def drop_after(turns: int, path: str, body: bytes, headers: list[tuple[bytes, bytes]], *, kill: bool = False) -> str:
    """One request whose client goes away ``turns`` turns of the loop after its body arrived
    (``kill``: the server cancels the application instead, with no http.disconnect); its stage.
    ``turns`` None: once its first token has gone out (mid-stream, whatever the timing)."""
    comm = ApplicationCommunicator(application(), scope("POST", path, headers))
    await comm.send_input({"type": "http.request", "body": body, "more_body": False})
    await gone(comm, turns, kill=kill)
    return stage(comm)


async def gone(comm: ApplicationCommunicator, turns: int | None, *, kill: bool = False) -> None:
    if turns is None:
        out = comm.output_queue._queue  # type: ignore[attr-defined]
        await until(lambda: any(b'"content":"' in m.get("body", b"") or b'"text":"' in m.get("body", b"") for m in out), lambda: "no token came", pause_s=0)
    for _ in range(turns or 0):
        await asyncio.sleep(0)
    if kill:
        comm.future.cancel()
    else:
        await comm.send_input({"type": "http.disconnect"})
    await comm.wait(10)  # raises what escaped the application


def turns_swept(stream: bool = False) -> Any:
    """0, 1, 2, ... in ever wider steps; a stream's first, once its first token went out (None)."""
    if stream:
        yield None
    turns = 0
    while turns < LAST_TURN:
        yield turns
        turns += 1 + turns // 12


def embedding_engine(link: Any) -> None:
    engine = link.worker.engine
    engine.features = frozenset({"embeddings"})
    engine.embed = lambda tokens: [float(len(tokens)), 1.0]


def with_key(rt: Any) -> None:
    """The runtime's one key: one request at a time, and a rate limit (never reached here)."""
    from keys.credentials import digest_of
    from keys.runtime import Snapshot
    from keys.snapshot import Key, Policy

    policy = Policy(name="one-at-a-time", max_concurrent=1, rate_limit_rpm=1_000_000)
    rt.snapshot = Snapshot(version=1, keys_by_digest={digest_of(SECRET): Key(id=1, name="sweeper", digest=digest_of(SECRET), policy=policy)})


def routed(monkeypatch: pytest.MonkeyPatch, link: Any, lanes: int) -> Any:
    """Several models as the consumers see them: the real router (scheduler/link/pool.py) with
    one model, ``lanes`` lanes, whose "worker" is the in-process link."""
    from api import consumers
    from scheduler.link.pool import ModelPool, PoolSetup
    from scheduler.models_config import ModelsConfig, ServedModel

    class Supervisor:
        exited = threading.Event()
        fatal = None
        on_fatal = None
        restarts = 0

        def start(self) -> None:
            pass

        def drain(self) -> None:
            self.exited.set()

        def kill(self) -> None:
            self.exited.set()

    class InProcessPool(ModelPool):
        def _load(self, model: str) -> None:  # the link is there already: loaded at the next turn
            self.links[model] = self.open_links[model] = link
            self.workers[model] = Supervisor()
            asyncio.get_running_loop().call_soon(self._loaded, model)

        def _loaded(self, model: str) -> None:
            self.router.loaded(model)
            self.kick()

    config = ModelsConfig((ServedModel(MODEL, Path("/m/sim.gguf")),))
    pool = InProcessPool(PoolSetup(config, spawn=None, lanes={MODEL: lanes}, ctx_sizes={MODEL: 512}))  # type: ignore[arg-type]
    monkeypatch.setattr(consumers, "get_pool", lambda: pool)
    return pool


def router_free(pool: Any, held: int = 0) -> None:
    m = pool.router.snapshot()["models"][MODEL]
    assert (m["inflight"], m["waiting"], len(pool.waiters)) == (held, 0, 0), m


def worker_runs_only(link: Any, jobs: set[str] = frozenset()) -> Callable[[], bool]:  # type: ignore[assignment]
    worker = link.worker
    return lambda: set(worker.scheduler.jobs) <= jobs and set(worker.contexts) <= jobs and not worker.preparing and worker.inbox.empty()


def nothing_held(link: Any, rt: Any) -> None:
    """The client's place (its key's, its address's) and the model's queue place are free; the
    link holds no job for the request."""
    assert not rt.slots.held and not rt.client_slots.held and not rt.in_flight.held, (rt.slots.held, rt.client_slots.held, rt.in_flight.held)
    assert not link.open and not link.inflight, (link.open, link.inflight)


def row_of(seen: str) -> tuple[int, str]:
    return {"before": (499, "client_disconnected"), "mid": (200, "client_disconnected"), "done": (200, "")}[seen]


async def rows(key: str = "") -> list[tuple[int, str]]:
    assert await asyncio.to_thread(activity_writer.flush)
    entries = await sync_to_async(list)(ActivityEntry.objects.order_by("id").values_list("status", "error_code", "key_name"))
    assert {k for _s, _e, k in entries} <= {key}, entries  # every row names its key
    return [(s, e) for s, e, _k in entries]


def catch_loop_errors() -> list[dict[str, Any]]:
    """What the loop reports (a task's exception nobody retrieved)."""
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: errors.append(context))
    return errors


@override_settings(SUPERFLUID_CLIENT_CONCURRENCY=1, SUPERFLUID_MAX_QUEUE=0)
@pytest.mark.parametrize(
    ("case", "keyed"),
    [
        ("chat", True),
        ("chat-stream", False),
        ("chat-stream", True),
        ("chat-n2", True),
        ("chat-n2-stream", False),
        ("completions-2-prompts-stream", True),
        ("embeddings", True),
    ],
)
async def test_a_client_leaving_at_any_turn_leaves_nothing_held_or_running_and_its_row_says_so(case: str, keyed: bool) -> None:
    """A keyed client of one request at a time (its policy's max_concurrent, with a rate limit),
    or a keyless one under --client-concurrency 1: each drop frees its place at once (the next
    request, the same client's, is admitted), and the worker stops its job."""
    path, body = CASES[case]
    errors = catch_loop_errors()
    sim = slow_sim()
    seen: list[str] = []
    async with attached(sim) as (link, rt):
        if keyed:
            with_key(rt)
        if case == "embeddings":
            embedding_engine(link)
        headers = KEYED if keyed else JSON
        for turns in turns_swept(stream=b'"stream": true' in body):
            seen.append(await drop_after(turns, path, body, headers))
            nothing_held(link, rt)
            await until(worker_runs_only(link), lambda: (turns, seen[-1], list(link.worker.scheduler.jobs)))  # noqa: B023
            if seen[-1] == "done":
                break
        assert (await request("POST", path, body, headers)).status == 200
        assert not errors, errors
    assert "before" in seen and seen[-1] == "done" and ("mid" in seen or "stream" not in case), seen
    assert await rows("sweeper" if keyed else "") == [row_of(s) for s in seen] + [(200, "")]


@override_settings(SUPERFLUID_CLIENT_CONCURRENCY=1, SUPERFLUID_MAX_QUEUE=0)
@pytest.mark.parametrize("case", ["chat-stream", "chat-n2", "embeddings"])
async def test_with_several_models_a_client_leaving_as_its_turn_comes_gives_back_its_lanes(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The router's path: the model's one lane is held, the request waits for it, the lane is
    given back and the client leaves that many turns later (before its dispatch reaches it, as
    it submits, as it streams, after): its ticket never stays taken."""
    path, body = CASES[case]
    errors = catch_loop_errors()
    sim = slow_sim()
    seen: list[str] = []
    async with attached(sim) as (link, rt):
        if case == "embeddings":
            embedding_engine(link)
        pool = routed(monkeypatch, link, lanes=1)
        for turns in turns_swept(stream=b'"stream": true' in body):
            _link, _dispatch, ticket = await pool.acquire(MODEL, 0)  # the lane, taken
            comm = ApplicationCommunicator(application(), scope("POST", path, JSON))
            await comm.send_input({"type": "http.request", "body": body, "more_body": False})
            await until(lambda: pool.router.waiting, lambda: "the request never reached the router")  # noqa: B023
            pool.release(ticket)  # its turn comes
            await gone(comm, turns)
            seen.append(stage(comm))
            nothing_held(link, rt)
            router_free(pool)
            await until(worker_runs_only(link), lambda: (turns, seen[-1], list(link.worker.scheduler.jobs)))  # noqa: B023
            if seen[-1] == "done":
                break
        assert (await request("POST", path, body, JSON)).status == 200
        router_free(pool)
        assert not errors, errors
    assert "before" in seen and seen[-1] == "done", seen
    assert await rows() == [row_of(s) for s in seen] + [(200, "")]


@override_settings(SUPERFLUID_CLIENT_CONCURRENCY=1, SUPERFLUID_MAX_QUEUE=0)
async def test_a_client_leaving_while_it_preempts_a_background_job_leaves_that_job_to_finish() -> None:
    """One lane, a background job on it, an interactive chat that parks it and then leaves at
    any turn: the parked job resumes and ends whole, and nothing else runs.

    The background job runs between the chats (and before each is prepared), so on a loaded
    machine it may finish before the sweep does: then it is checked whole and another takes the
    lane, so that every chat of the sweep still finds one to preempt."""
    from scheduler.core.qos import QosClass
    from scheduler.link.messages import Done, Error, Rejected

    path, body = CASES["chat-stream"]
    errors = catch_loop_errors()
    sim = slow_sim(lanes=1)
    seen: list[str] = []
    headers = [*JSON, (b"x-superfluid-qos", b"interactive")]
    async with attached(sim) as (link, rt):

        async def on_the_lane() -> Any:
            job = await link.submit(
                request={"endpoint": "completions", "model": MODEL, "prompt": "long", "max_tokens": 400, "temperature": 0.0},
                qos=int(QosClass.BACKGROUND),
                priority=-100,
            )
            lanes = link.worker.scheduler.lanes
            await until(lambda: any(j is not None and j.job_id == job.job_id for j in lanes), lambda: "the background job never took the lane")
            return job

        async def ended_whole(job: Any) -> None:
            async with asyncio.timeout(30):  # bounds a hang only: a parked job never resumed
                while not isinstance(event := await job.next_event(), (Done, Error, Rejected)):
                    pass
            assert isinstance(event, Done) and event.usage["completion_tokens"] == 400, event
            link.finish(job)

        background = await on_the_lane()
        backgrounds = 1
        for turns in turns_swept(stream=True):
            seen.append(await drop_after(turns, path, body, headers))
            assert link.open == {background.job_id} and set(link.inflight) <= {background.job_id}, (link.open, set(link.inflight))
            assert not rt.slots.held and not rt.client_slots.held and not rt.in_flight.held
            await until(worker_runs_only(link, {background.job_id}), lambda: (turns, list(link.worker.scheduler.jobs)))  # noqa: B023
            if seen[-1] == "done":
                break
            if background.job_id not in link.inflight:  # it ended (its last event is queued): another one
                await ended_whole(background)
                background = await on_the_lane()
                backgrounds += 1
        assert link.worker.scheduler.counters["parks"] >= 1  # some did preempt it
        await ended_whole(background)
        assert not link.open and not link.inflight, (link.open, link.inflight)
        assert not errors, errors
    assert "before" in seen and seen[-1] == "done", (seen, backgrounds)
    assert await rows() == [row_of(s) for s in seen]


@override_settings(SUPERFLUID_CLIENT_CONCURRENCY=1, SUPERFLUID_MAX_QUEUE=0)
@pytest.mark.parametrize("case", ["chat-stream", "chat-n2-stream"])
async def test_an_application_cancelled_without_a_disconnect_stops_its_response(case: str) -> None:
    """The server cancels the application itself, no http.disconnect handled (daphne kills one
    at shutdown and one that outlived its close timeout): the response runs in a task of its
    own, which went on for nobody, its job on a lane and the client's place held until the job
    ended (the next request of a client of one at a time was 429). It stops as a disconnect
    stops it, with its row."""
    path, body = CASES[case]
    errors = catch_loop_errors()
    sim = slow_sim()
    seen: list[str] = []
    async with attached(sim) as (link, rt):
        for turns in turns_swept(stream=True):
            comm = ApplicationCommunicator(application(), scope("POST", path, JSON))
            await comm.send_input({"type": "http.request", "body": body, "more_body": False})
            await until(lambda: rt.client_slots.held, lambda: "never admitted", pause_s=0)  # from here its response task has begun
            await gone(comm, turns, kill=True)
            seen.append(stage(comm))
            nothing_held(link, rt)
            await until(worker_runs_only(link), lambda: (turns, list(link.worker.scheduler.jobs)))  # noqa: B023
            if seen[-1] == "done":
                break
        assert not errors, errors
    assert "before" in seen and "mid" in seen and seen[-1] == "done", seen
    assert await rows() == [row_of(s) for s in seen]
