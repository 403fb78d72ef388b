"""Clients leaving while the scheduler moves their jobs around: a Hypothesis net over the
in-process layer (tests/edge/inproc.py: the ASGI application, admission, the link, the worker's
loop and the simulated engine).

Each example draws a worker of one or two lanes and a few chat requests of different QoS classes
(``x-superfluid-qos``), some with ``n`` > 1, some streamed, each arriving once the one before it has
had a drawn number of link events; some clients leave at a drawn point counted in events, never
in wall time: a number of turns after their body, a number of link events (Accepted, Delta) for
their jobs, or once a job of theirs is parked by a preemption (some with no http.disconnect:
the server cancels the application); keyed or keyless, through the model router or not;
sometimes the server drains meanwhile. Once everything has settled: nothing is held (key and client slots, the model's queue
place, the link's jobs), the worker runs nothing and has no lane, parked KV or queued job left,
the worker never crashed, each request that stayed has exactly the tokens and finish it has
alone, each request has one activity row that says what happened, and every job cancelled at
the worker was a leaving client's, cancelled once, and counted once in
``superfluid_cancelled_total``."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import ApplicationCommunicator
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activity import writer as activity_writer
from activity.models import ActivityEntry

from .inproc import JSON, MODEL, SimWorker, application, attached, request, scope
from .test_cancel_sweep import SECRET, routed, router_free

KEYED = [*JSON, (b"authorization", f"Bearer {SECRET}".encode())]


def with_key(rt: Any) -> None:
    """The runtime's one key, whose policy limits it to 8 requests at a time (never reached)."""
    from keys.credentials import digest_of
    from keys.runtime import Snapshot
    from keys.snapshot import Key, Policy
    from scheduler.core.qos import QosClass

    policy = Policy(name="eight-at-a-time", max_class=QosClass.INTERACTIVE, max_concurrent=8, rate_limit_rpm=1_000_000)
    rt.snapshot = Snapshot(version=1, keys_by_digest={digest_of(SECRET): Key(id=1, name="leaver", digest=digest_of(SECRET), policy=policy)})

pytestmark = pytest.mark.django_db(transaction=True)

CLASSES = ("interactive", "completion", "agent", "background")
PATH = "/v1/chat/completions"
LIMIT_S = 20.0  # bounds a hang only


@dataclass(frozen=True)
class Req:
    qos: str
    n: int
    stream: bool
    max_tokens: int
    after: int  # it arrives once the request before it has had this many link events (or ended)
    drop: tuple[str, int] | None  # ("turns" | "killed", k) | ("events", k) | ("parked", 0) | None: stays


PREAMBLE = "A preamble every request shares, long enough to be copied: "  # prefix sharing between lanes


def content_of(i: int) -> str:
    return f"{PREAMBLE}req-{i}"


def body_of(i: int, r: Req) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": content_of(i)}], "max_tokens": r.max_tokens, "n": r.n, "stream": r.stream}).encode()


def tag_of(request: dict[str, Any]) -> str:
    return str(request["messages"][0]["content"])


requests_ = st.builds(
    Req,
    qos=st.sampled_from(CLASSES),
    n=st.sampled_from((1, 1, 2)),
    stream=st.booleans(),
    max_tokens=st.sampled_from((1, 6, 24, 40)),
    after=st.integers(0, 6),
    drop=st.one_of(
        st.none(),
        st.tuples(st.just("turns"), st.integers(0, 400)),
        # the server cancels the application itself, no http.disconnect (daphne at shutdown, or
        # past its close timeout)
        st.tuples(st.just("killed"), st.integers(0, 400)),
        st.tuples(st.just("events"), st.integers(0, 40)),
        st.tuples(st.just("parked"), st.just(0)),
    ),
)


@dataclass(frozen=True)
class Case:
    lanes: int
    reqs: tuple[Req, ...]
    drain_after: int | None  # turns after every request reached the worker (or ended), or no drain
    routed: bool  # through the model router (several models' path: its lanes are reserved per request)
    keyed: bool  # every request with one key (its concurrency slots), else keyless (a client's slots)


cases = st.builds(
    Case,
    lanes=st.sampled_from((1, 2)),
    # as drawn, or the lower classes first: those that arrive later then preempt them
    reqs=st.lists(requests_, min_size=1, max_size=5).flatmap(lambda rs: st.sampled_from((tuple(rs), tuple(sorted(rs, key=lambda r: -CLASSES.index(r.qos)))))),
    drain_after=st.one_of(st.none(), st.integers(0, 200)),
    routed=st.booleans(),
    keyed=st.booleans(),
)


async def until(condition: Callable[[], object], what: Callable[[], object], limit_s: float = LIMIT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not condition():
        assert loop.time() < deadline, what()
        await asyncio.sleep(0.001)


def complete(comm: ApplicationCommunicator) -> bool:
    out = comm.output_queue._queue  # type: ignore[attr-defined]
    return any(m["type"] == "http.response.body" and not m.get("more_body") for m in out)


def stage(comm: ApplicationCommunicator) -> str:
    out = list(comm.output_queue._queue)  # type: ignore[attr-defined]
    if not out:
        return "before"
    assert out[0]["type"] == "http.response.start" and out[0]["status"] == 200, (out[0], out[1:2])
    return "done" if complete(comm) else "mid"


def answer(comm: ApplicationCommunicator, stream: bool) -> list[tuple[str, str | None]]:
    """(content, finish_reason) per choice, from a whole reply."""
    out = list(comm.output_queue._queue)  # type: ignore[attr-defined]
    body = b"".join(m.get("body", b"") for m in out if m["type"] == "http.response.body")
    if not stream:
        return [(c["message"]["content"], c["finish_reason"]) for c in json.loads(body)["choices"]]
    frames = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
    assert frames and frames[-1] == "[DONE]", frames[-3:]
    texts: dict[int, str] = {}
    reasons: dict[int, str | None] = {}
    for frame in frames[:-1]:
        obj = json.loads(frame)
        assert "error" not in obj, obj
        for choice in obj["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + (choice["delta"].get("content") or "")
            if choice.get("finish_reason"):
                reasons[choice["index"]] = choice["finish_reason"]
    return [(texts.get(i, ""), reasons.get(i)) for i in sorted(set(texts) | set(reasons))]


REFERENCE: dict[tuple[int, int], tuple[str, str | None]] = {}  # (tag, max_tokens) -> its answer alone


async def references(case: Case) -> None:
    """What each request answers alone (the simulated engine's tokens are a function of the
    sequence), from a worker of its own."""
    wanted = {(i, r.max_tokens) for i, r in enumerate(case.reqs)} - set(REFERENCE)
    if not wanted:
        return
    async with attached(SimWorker(lanes=1)):
        for i, max_tokens in sorted(wanted):
            reply = await request("POST", PATH, body_of(i, Req("agent", 1, False, max_tokens, 0, None)), JSON)
            assert reply.status == 200, reply.body
            choice = reply.json()["choices"][0]
            REFERENCE[(i, max_tokens)] = (choice["message"]["content"], choice["finish_reason"])


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


async def scenario(case: Case) -> None:
    from scheduler.core.kv_pool import blocks

    await references(case)
    await asyncio.to_thread(activity_writer.flush)
    first_row = await sync_to_async(lambda: (ActivityEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0))()
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: errors.append(context))
    sim = SimWorker(lanes=case.lanes, step_sleep_s=0.001)
    async with attached(sim) as (link, rt), contextlib.AsyncExitStack() as stack:
        if case.keyed:
            with_key(rt)
        pool = routed(stack.enter_context(pytest.MonkeyPatch.context()), link, case.lanes) if case.routed else None
        worker = link.worker
        sched = worker.scheduler
        tags = {content_of(i): i for i in range(len(case.reqs))}
        job_of: dict[str, int] = {}  # job id -> request index
        events: Counter[int] = Counter()  # request index -> link events (Accepted, Delta) for its jobs
        accepted: set[str] = set()
        cancelled: Counter[str] = Counter()  # job id -> cancels the scheduler acted on (worker thread)

        on_message = link._on_message

        def counting(message: Any) -> None:
            i = job_of.get(getattr(message, "id", ""))
            if i is not None and message.type in ("accepted", "delta") and message.id in link.inflight:
                events[i] += 1
                if message.type == "accepted":
                    accepted.add(message.id)
            on_message(message)

        link._on_message = counting  # type: ignore[method-assign]
        submit = link.submit

        async def noting(**fields: Any) -> Any:
            handle = await submit(**fields)
            job_of[handle.job_id] = tags[tag_of(fields["request"])]
            return handle

        link.submit = noting  # type: ignore[method-assign]
        cancel = sched.cancel

        def counted(job_id: str, reason: str = "cancelled") -> bool:
            acted = cancel(job_id, reason)
            if acted and reason == "cancelled":
                cancelled[job_id] += 1
            return acted

        sched.cancel = counted  # type: ignore[method-assign]

        comms: list[ApplicationCommunicator | None] = [None] * len(case.reqs)
        stages: list[str] = [""] * len(case.reqs)

        def jobs(i: int) -> set[str]:
            return {j for j, k in job_of.items() if k == i}

        def parked(i: int) -> bool:
            return any(p["job_id"] in jobs(i) for p in (link.snapshot or {}).get("parked", []))

        async def client(i: int, r: Req) -> None:
            if i > 0:  # counted in events, so the one before is queued, prefilling or decoding by then
                await until(lambda: comms[i - 1] is not None and (events[i - 1] >= r.after or comms[i - 1].future.done()), lambda: ("never began", i))  # type: ignore[union-attr]
            headers = [*(KEYED if case.keyed else JSON), (b"x-superfluid-qos", r.qos.encode())]
            comm = comms[i] = ApplicationCommunicator(application(), scope("POST", PATH, headers))
            await comm.send_input({"type": "http.request", "body": body_of(i, r), "more_body": False})
            if r.drop is not None:
                kind, k = r.drop
                if kind == "killed":  # once its response has begun (a job submitted): before, there is no task to stop
                    await until(lambda: jobs(i) or comm.future.done(), lambda: ("never submitted", i))
                if kind in ("turns", "killed"):
                    for _ in range(k):
                        await asyncio.sleep(0)
                elif kind == "events":
                    await until(lambda: events[i] >= k or complete(comm), lambda: ("events", i, events[i]))
                else:
                    await until(lambda: parked(i) or complete(comm), lambda: ("never parked nor done", i))
            else:
                await until(lambda: complete(comm), lambda: ("no whole answer", i, list(comm.output_queue._queue)[-2:]))  # type: ignore[attr-defined]
            stages[i] = stage(comm)
            if r.drop is not None and r.drop[0] == "killed":
                comm.future.cancel()
            else:
                await comm.send_input({"type": "http.disconnect"})
            await comm.wait(LIMIT_S)
            if r.drop is not None:
                stages[i] = stage(comm)  # what had gone out once it was gone

        async def drainer(turns: int) -> None:
            def arrived(i: int) -> bool:  # every job of it accepted, or it ended
                comm = comms[i]
                return comm is not None and (len(accepted & jobs(i)) == case.reqs[i].n or comm.future.done())

            await until(lambda: all(arrived(i) for i in range(len(case.reqs))), lambda: "requests never arrived")
            for _ in range(turns):
                await asyncio.sleep(0)
            link.drain()

        tasks = [client(i, r) for i, r in enumerate(case.reqs)]
        if case.drain_after is not None:
            tasks.append(drainer(case.drain_after))
        await asyncio.gather(*tasks)

        # -- settled -------------------------------------------------------------------------
        def settled() -> bool:
            return (
                not link.open and not link.inflight and not sched.jobs and not worker.contexts
                and not worker.preparing and sched.idle
                # a drained worker that stopped reads no more (a cancel of a job that had ended may wait there)
                and (worker.inbox.empty() or worker.stopped.is_set())
            )  # fmt: skip

        await until(settled, lambda: (link.open, set(link.inflight), list(sched.jobs), list(worker.contexts), list(worker.preparing)))
        if case.drain_after is not None:
            await until(lambda: worker.stopped.is_set(), lambda: "the drained worker never stopped")
        else:  # a snapshot taken after the last cancel counted
            await until(
                lambda: link.snapshot is not None
                and all(link.snapshot["counters"][c] == sched.counters[c] for c in ("cancelled", "finished", "admitted", "parks", "resumes"))
                and link.snapshot["lanes_active"] == 0,
                lambda: (link.snapshot or {}).get("counters"),
            )
        assert link.worker is worker and link.restarts == 0, "the worker crashed"
        assert not errors, errors
        assert not rt.slots.held and not rt.client_slots.held and not rt.in_flight.held, (rt.slots.held, rt.client_slots.held, rt.in_flight.held)
        if pool is not None:
            router_free(pool)
        assert all(job is None for job in sched.lanes), sched.lanes
        assert not list(sched.queues), list(sched.queues)
        # the KV pool holds no lane's blocks and no prefix half-filled or held for a copy
        assert not sched._lane_tokens() and not sched._release and not sched._release_keep
        assert not any(e.pending or e.held for e in sched.pool.entries.values()), sched.pool.entries
        if case.drain_after is None:
            pool = link.snapshot["pool"]
            assert pool["blocks_used"] == pool["cached_blocks"] + sum(blocks(n) for n in sched._kept_tokens()), pool

        # every cancel the worker acted on was a leaving client's job, once
        # (a job whose submit the client's leave cut short has no request noted: never a staying one's)
        staying = {j for j, i in job_of.items() if case.reqs[i].drop is None}
        assert not set(cancelled) & staying, (set(cancelled) & staying, case)
        assert all(v == 1 for v in cancelled.values()), cancelled
        assert sched.counters["cancelled"] == sum(cancelled.values()), (sched.counters["cancelled"], cancelled)
        finishes = worker.metrics.finishes
        assert sum(by.get("cancelled", 0) for by in finishes.values()) == sched.counters["cancelled"], finishes
        if case.drain_after is None:
            text = (await request("GET", "/metrics")).body.decode()
            assert metric(text, "superfluid_cancelled_total") == sched.counters["cancelled"]
            assert metric(text, "superfluid_lanes_active") == 0
            assert metric(text, "superfluid_jobs_parked") == 0

        # each request that stayed, or that had its whole answer before it left, as alone
        for i, r in enumerate(case.reqs):
            comm = comms[i]
            assert comm is not None
            if r.drop is None or stages[i] == "done":
                assert stages[i] == "done", (i, r, stages[i])
                got = answer(comm, r.stream)
                assert got == [REFERENCE[(i, r.max_tokens)]] * r.n, (i, r, got, REFERENCE[(i, r.max_tokens)])

    # one activity row per request, saying what happened
    await asyncio.to_thread(activity_writer.flush)
    rows = await sync_to_async(list)(ActivityEntry.objects.filter(id__gt=first_row).order_by("id").values_list("request_id", "status", "error_code", "qos_class"))
    assert len(rows) == len(case.reqs), (rows, stages, case)
    expected = {"before": (499, "client_disconnected"), "mid": (200, "client_disconnected"), "done": (200, "")}
    by_request: dict[int, tuple[int, str]] = {}
    unnamed: list[tuple[int, str]] = []
    for request_id, status, code, qos in rows:
        i = job_of.get(request_id)
        if i is None:
            unnamed.append((status, code))
            continue
        assert i not in by_request, (i, rows)
        assert qos == case.reqs[i].qos, (i, qos, case.reqs[i])
        by_request[i] = (status, code)
    for i, _r in enumerate(case.reqs):
        if i in by_request:
            assert by_request[i] == expected[stages[i]], (i, case.reqs[i], stages[i], by_request[i], case)
        else:  # gone before its job was submitted
            assert stages[i] == "before" and case.reqs[i].drop is not None, (i, stages[i], rows)
    assert unnamed == [expected["before"]] * (len(case.reqs) - len(by_request)), (unnamed, stages)


@pytest.fixture
def fresh_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases)
def test_clients_leaving_at_any_point_of_the_schedule_leave_nothing_behind_and_touch_no_one_else(fresh_loop: asyncio.AbstractEventLoop, case: Case) -> None:
    # places that are taken and given back, never refused (at most 5 requests at a time)
    with override_settings(SUPERFLUID_CLIENT_CONCURRENCY=8, SUPERFLUID_MAX_QUEUE=0):
        fresh_loop.run_until_complete(scenario(case))


async def test_a_job_cut_off_by_a_drain_timeout_is_an_error_finish_not_a_cancel() -> None:
    """``superfluid_cancelled_total`` counts jobs cancelled by their client (docs/operations.md:
    "jobs cancelled (disconnects)"; api/metrics.py: "client disconnect or explicit cancel"). A
    job the drain's timeout cuts off ends with a ``shutdown`` error its client sees: it is an
    ``error`` finish in ``superfluid_jobs_finished_total``, and no cancel."""
    import time

    from scheduler.core.scheduler import SchedulerConfig
    from scheduler.engines.sim import SimEngine
    from scheduler.link.inprocess import InProcessTransport
    from scheduler.link.messages import SHUTDOWN, Delta, Error
    from scheduler.worker.loop import EngineWorker

    def make_worker() -> EngineWorker:
        engine = SimEngine(n_lanes=2, lane_ctx=512)
        engine.on_call = lambda _n: time.sleep(0.01)
        return EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=512), model_name=MODEL, prepare_in_thread=True)

    link = InProcessTransport(make_worker, drain_timeout_s=0.2)
    handle = await link.submit(request={"endpoint": "completions", "model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0.0})
    async with asyncio.timeout(LIMIT_S):
        while not isinstance(await handle.next_event(), Delta):
            pass
        link.drain()
        while not isinstance(event := await handle.next_event(), Error):
            pass
        await link.exited.wait()
    assert event.reason == SHUTDOWN
    worker = link.worker
    assert worker is not None and worker.stopped.is_set()
    assert worker.scheduler.counters["cancelled"] == 0, worker.scheduler.counters
    assert link.snapshot is not None and link.snapshot["counters"]["cancelled"] == 0  # what /metrics shows
    finishes = link.snapshot["metrics"]["finished"]
    assert sum(by.get("error", 0) for by in finishes.values()) == 1 and not any(by.get("cancelled") for by in finishes.values()), finishes
    await link.stop()


def test_a_job_cancelled_as_the_drain_ends_is_counted_as_a_cancelled_finish() -> None:
    """The client of the last job leaves during a drain while it is queued: its cancel empties
    the scheduler and the worker stops at once, before a tick processes the job's end. It was counted in
    ``superfluid_cancelled_total`` but never in ``superfluid_jobs_finished_total{reason=
    "cancelled"}`` (the Hypothesis net above found it: an interactive chat dropped, drain)."""
    from scheduler.core.qos import QosClass
    from scheduler.link.messages import Cancel, Submit
    from scheduler.worker.server import Connection
    from tests.link.conftest import completion, sim_worker

    worker = sim_worker(prepare_in_thread=False)
    conn = Connection(1, None)
    worker.handle(conn, Submit(id="leaving", request=completion(max_tokens=40), qos=int(QosClass.INTERACTIVE), priority=0))
    assert worker.scheduler.jobs["leaving"].lane is None  # queued: no tick has planned it yet
    worker.drain()
    worker.inbox.put((conn, Cancel("leaving")))  # its client leaves
    worker.run(drain_timeout_s=10)
    assert worker.scheduler.counters["cancelled"] == 1
    assert worker.metrics.finishes == {"interactive": {"cancelled": 1}}, worker.metrics.finishes
    assert worker.snapshot()["metrics"]["finished"] == {"interactive": {"cancelled": 1}}
