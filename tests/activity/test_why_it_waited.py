"""Why did my request wait? For each reason a request can wait or be slowed, its activity row
says so: the fields a user reads (class, band, queue wait, first token, total, preemptions, the
router's wait and score, status and error code), through the real consumers, admission and
worker loop around the simulated engine (the in-process middle layer, tests/edge/inproc.py).

The worker's times (queue_wait_ms, ttft_ms, total_ms of a request its worker answered) are on
the simulated engine's clock, which moves only with its work: they are compared with each other,
never with the wall clock."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any, cast

import pytest
from asgiref.sync import sync_to_async
from channels.testing import ApplicationCommunicator
from django.test import override_settings

from activity import writer as activity_writer
from activity.models import ActivityEntry
from scheduler.core.qos import QosClass
from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.worker.loop import EngineWorker
from tests.edge.inproc import JSON, MODEL, SimWorker, application, attached, chat_body, request, scope, stand_in_pool
from tests.edge.test_cancel_sweep import until

pytestmark = pytest.mark.django_db(transaction=True)

FIELDS = ("request_id", "endpoint", "stream", "qos_class", "priority", "band", "serial_priority", "serial_band", "serial_score",
          "serial_queue_wait_ms", "queue_wait_ms", "held_wait_ms", "ttft_ms", "total_ms", "prompt_tokens", "cached_tokens", "completion_tokens",
          "preemptions", "finish_reason", "status", "error_code")


async def rows() -> list[dict[str, Any]]:
    assert await asyncio.to_thread(activity_writer.flush)
    return await sync_to_async(list)(ActivityEntry.objects.order_by("id").values(*FIELDS))


async def rows_of(*handles: Any) -> list[dict[str, Any]]:
    """The rows of the requests whose (first) jobs these are, in that order."""
    found = {r["request_id"]: r for r in await rows()}
    return [found[h.job_id] for h in handles]


def qos(label: str) -> list[tuple[bytes, bytes]]:
    return [*JSON, (b"x-superfluid-qos", label.encode())]


class ConfiguredSim(SimWorker):
    """The simulated worker with scheduler settings of its own (``--class-lanes``, parking or
    recomputing a preempted job) and the worker's ``--completion-deadline-ms``."""

    def __init__(self, *, class_lanes: dict[QosClass, int] | None = None, park: bool = True, completion_deadline_ms: int = 0, **kw: Any) -> None:
        super().__init__(**kw)
        self.class_lanes, self.park, self.completion_deadline_ms = class_lanes or {}, park, completion_deadline_ms

    def make_worker(self) -> EngineWorker:
        clock = FakeClock()
        engine = self.engine_class(n_lanes=self.lanes, lane_ctx=self.lane_ctx, clock=clock)
        if self.step_sleep_s > 0:  # a slower engine (tests/edge/inproc.py's), for jobs still running when looked at

            def slow(_n: int) -> None:
                time.sleep(self.step_sleep_s)

            engine.on_call = slow
        config = SchedulerConfig(max_batch=self.lanes, lane_ctx=self.lane_ctx, class_lanes=self.class_lanes, park=self.park)
        return EngineWorker(engine, config, model_name=MODEL, clock=clock, prepare_in_thread=True,
                            completion_deadline_ms=self.completion_deadline_ms)


async def opened(body: bytes, headers: list[tuple[bytes, bytes]], path: str = "/v1/chat/completions") -> ApplicationCommunicator:
    comm = ApplicationCommunicator(application(), scope("POST", path, headers))
    await comm.send_input({"type": "http.request", "body": body, "more_body": False})
    return comm


async def left(comm: ApplicationCommunicator) -> None:
    await comm.send_input({"type": "http.disconnect"})
    await comm.wait(10)


async def answered(comm: ApplicationCommunicator) -> int:
    """The status of a request opened with :func:`opened`, its reply read to the end."""
    start = await comm.receive_output(30)
    assert start["type"] == "http.response.start", start
    while (await comm.receive_output(30)).get("more_body", False):
        pass
    await left(comm)
    return int(start["status"])


async def one_job(link: Any, known: set[str]) -> Any:
    """The handle of the one job submitted since ``known`` (the ids seen before)."""
    await until(lambda: set(link.inflight) - known, lambda: "no job was submitted")
    [job_id] = set(link.inflight) - known
    known.add(job_id)
    return link.inflight[job_id]


async def queued_at_the_worker(link: Any, handle: Any) -> None:
    """Until the worker has the job (prepared, in its scheduler): it arrived there."""
    await until(lambda: handle.job_id in link.worker.scheduler.jobs, lambda: "the job never reached the worker's queue")


async def generating(link: Any, known: set[str], text: str, max_tokens: int, label: str) -> tuple[ApplicationCommunicator, Any]:
    """A streamed chat of class ``label`` opened, and its job (one since ``known``) generating."""
    comm = await opened(chat_body(text, max_tokens=max_tokens, stream=True), qos(label))
    job = await one_job(link, known)
    await until(lambda: job.delivered_tokens > 0, lambda: f"the {label} job never ran")
    return comm, job


def generated(link: Any, handle: Any) -> int:
    """The tokens the engine has generated for a job so far (ahead of what reached the web side)."""
    return int(link.worker.engine.generated.get(handle.job_id, 0))


# -- preempted before its first token --------------------------------------------------------


@pytest.mark.parametrize(("stream", "n"), [(True, 1), (False, 1), (False, 2)])
async def test_a_client_that_leaves_while_parked_before_its_first_token_has_no_first_token_time(stream: bool, n: int) -> None:
    """One lane: a background chat with a long prompt is preempted by an interactive one while
    it still prefills (no token yet), and its client leaves while it is parked. The worker says a
    preemption at once, in a Delta without text: its row has the preemption, and no time to a
    first token that never came (the link relays no such Delta as an event)."""
    async with attached(SimWorker(lanes=1, lane_ctx=2048, step_sleep_s=0.01)) as (link, _rt):
        background = await opened(chat_body("p" * 1500, max_tokens=50, stream=stream, n=n), qos("background"))
        await until(lambda: len(link.inflight) == n, lambda: "the background request was never submitted")
        handles = list(link.inflight.values())
        engine = link.worker.engine
        await until(lambda: len(engine.calls) >= 1, lambda: "the background job never ran")
        interactive = await opened(chat_body("y", max_tokens=400, stream=True), qos("interactive"))
        await until(lambda: any(h.preemptions for h in handles), lambda: "the head never heard that the job was preempted")
        assert not any(h.delivered_tokens for h in handles), "a token came before the preemption: the prompt was too short"
        await left(background)
        await until(lambda: len(link.inflight) == 1, lambda: "the background job was not cancelled")
        await left(interactive)
        await until(lambda: not link.inflight, lambda: "the interactive job was not cancelled")
    row, _interactive = await rows()
    assert (row["qos_class"], row["error_code"], row["preemptions"]) == ("background", "client_disconnected", 1), row
    assert row["ttft_ms"] is None, row  # no token ever came
    assert not row["completion_tokens"], row
    assert row["total_ms"] is not None and row["total_ms"] > 0, row
    assert row["queue_wait_ms"] is None  # the worker never answered: the time it was open is total_ms


# -- a batch line ----------------------------------------------------------------------------


@override_settings(SUPERFLUID_RATE_LIMIT=1)
async def test_a_batch_line_has_a_row_of_its_own_in_the_background_class_refused_or_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each try of a batch line is a request with a row, in the background class (the runner runs
    every line there) and its priority moved into the batch band. A line refused by admission
    (429: the batch's rate; it is tried again later) had the class it would have asked for over
    HTTP (``--http-default-qos``, agent) and a normal-band priority: the log showed an agent
    request refused, and a filter by class lost the batch's refused tries."""
    from batches import runner
    from batches.models import Batch, File, Line

    logged: list[dict[str, Any]] = []  # (the runner's database and the writer's would lock each other)
    monkeypatch.setattr("activity.writer.submit", logged.append)

    def make() -> tuple[Batch, Line]:
        f = File.objects.create(purpose="batch", filename="in.jsonl", bytes=1, content=b"x", owner="")
        b = Batch.objects.create(endpoint="/v1/chat/completions", input_file=f, owner="", total=2)
        body = json.loads(chat_body("a line", max_tokens=4))
        Line.objects.bulk_create([Line(batch=b, index=i, custom_id=f"c{i}", body=body) for i in range(2)])
        runner.begin(b.id)
        return b, Line.objects.get(batch=b, index=0)

    b, line = await sync_to_async(make)()
    async with attached(SimWorker()):
        principal = await runner._principal("", b.id)
        served = await runner._call(b, line, principal)
        refused = await runner._call(b, line, principal)
    assert (served[0], refused[0]) == (200, 429)
    assert len(logged) == 2
    ok, limited = logged
    assert (ok["status"], ok["error_code"], ok["qos_class"], ok["band"]) == (200, "", "background", "batch"), ok
    assert ok["queue_wait_ms"] is not None and ok["preemptions"] == 0
    assert (limited["status"], limited["error_code"]) == (429, "rate_limit_exceeded"), limited
    assert (limited["qos_class"], limited["band"], limited["priority"]) == ("background", "batch", ok["priority"]), limited
    assert limited["queue_wait_ms"] is None and limited["ttft_ms"] is None and limited["preemptions"] == 0


# -- queued behind other work ----------------------------------------------------------------

DECODE_ROUND_MS = 60.0  # the simulated engine's clock: every call advances it a decode round at least


async def test_a_request_queued_behind_a_busier_class_has_that_wait_as_its_queue_wait() -> None:
    """One lane, an agent chat generating. A background chat arrives, then a second agent chat:
    the agent goes first (its class is served before background), so the background request,
    which came first, waits for both. Its row's queue wait says so: at least the whole time the
    later agent request was at the worker, and its first token came after it."""
    async with attached(SimWorker(lanes=1, step_sleep_s=0.004)) as (link, _rt):
        known: set[str] = set()
        first, first_job = await generating(link, known, "a", 80, "agent")
        background = await opened(chat_body("b", max_tokens=10), qos("background"))
        await queued_at_the_worker(link, bg_job := await one_job(link, known))
        second = await opened(chat_body("c", max_tokens=10), qos("agent"))
        await queued_at_the_worker(link, agent_job := await one_job(link, known))
        assert generated(link, first_job) < 80, "the first agent job ended before the others queued"
        assert [await answered(c) for c in (first, background, second)] == [200, 200, 200]
    bg, agent = await rows_of(bg_job, agent_job)
    assert (bg["qos_class"], agent["qos_class"]) == ("background", "agent")
    assert bg["queue_wait_ms"] >= agent["total_ms"] > agent["queue_wait_ms"], (bg, agent)
    assert bg["queue_wait_ms"] <= bg["ttft_ms"] <= bg["total_ms"] and bg["preemptions"] == 0, bg
    assert bg["held_wait_ms"] == 0  # it waited for the lane, which was never free
    # with one model the serial fields are the worker's own dispatch: its wait, its band
    assert (bg["serial_queue_wait_ms"], bg["serial_band"], bg["serial_priority"]) == (bg["queue_wait_ms"], bg["band"], bg["priority"]), bg
    assert bg["serial_score"] is not None


async def test_a_request_held_back_by_its_class_lane_cap_has_that_wait_as_its_queue_wait() -> None:
    """Two lanes, background capped at one (``--class-lanes background=1``): a second background
    chat waits although a lane is free, and an agent chat that came after it takes that lane at
    once. The capped request's queue wait covers the rest of the first background job's run."""
    sim = ConfiguredSim(lanes=2, class_lanes={QosClass.BACKGROUND: 1}, step_sleep_s=0.004)
    async with attached(sim) as (link, _rt):
        known: set[str] = set()
        first, first_job = await generating(link, known, "a", 80, "background")
        capped = await opened(chat_body("b", max_tokens=10), qos("background"))
        capped_job = await one_job(link, known)
        await queued_at_the_worker(link, capped_job)
        left_of_first = 80 - generated(link, first_job)  # at most the tokens still to come when the capped one arrived
        assert sim.busy() == (1, 1), "the second background job is not held back with a lane free"
        assert left_of_first > 10, "the first background job ended before the second queued"
        agent = await opened(chat_body("c", max_tokens=10), qos("agent"))
        agent_job = await one_job(link, known)
        assert [await answered(c) for c in (first, capped, agent)] == [200, 200, 200]
    capped_row, agent_row = await rows_of(capped_job, agent_job)
    assert capped_row["qos_class"] == "background" and agent_row["qos_class"] == "agent"
    assert capped_row["queue_wait_ms"] >= (left_of_first - 1) * DECODE_ROUND_MS, (capped_row, left_of_first)
    assert agent_row["queue_wait_ms"] < capped_row["queue_wait_ms"], (agent_row, capped_row)
    assert capped_row["preemptions"] == 0
    # why: part of its wait a lane was free that its class could not take (held_wait_ms), the
    # rest (while the agent request had that lane) it waited for a lane
    assert 0 < capped_row["held_wait_ms"] <= capped_row["queue_wait_ms"], capped_row
    assert agent_row["held_wait_ms"] == 0


# -- preempted -------------------------------------------------------------------------------


@pytest.mark.parametrize(("stream", "park"), [(True, True), (False, False)], ids=["stream-parked", "whole-recomputed"])
async def test_a_request_preempted_and_finished_has_the_preemption_and_the_time_it_lost(stream: bool, park: bool) -> None:
    """One lane: a background chat generates, an interactive chat takes its lane (parked, or
    released and recomputed later) and ends, the background one resumes and finishes. Its row
    says preemptions=1, and its time from first token to end holds the interactive's whole run."""
    async with attached(ConfiguredSim(lanes=1, park=park, step_sleep_s=0.004)) as (link, _rt):
        known: set[str] = set()
        background = await opened(chat_body("x", max_tokens=60, stream=stream), qos("background"))
        job = await one_job(link, known)
        await until(lambda: generated(link, job) > 0, lambda: "the background job never ran")
        urgent = await request("POST", "/v1/chat/completions", chat_body("y", max_tokens=10), qos("interactive"), timeout_s=30)
        assert urgent.status == 200
        assert await answered(background) == 200
        assert link.worker.scheduler.counters["parks" if park else "preemptions"] >= 1
    found = await rows()
    [bg] = [r for r in found if r["request_id"] == job.job_id]
    [interactive] = [r for r in found if r["request_id"] == urgent.headers["x-request-id"]]
    assert (bg["qos_class"], bg["status"], bg["finish_reason"], bg["completion_tokens"]) == ("background", 200, "length", 60), bg
    assert bg["preemptions"] == 1 and interactive["preemptions"] == 0, (bg, interactive)
    assert bg["total_ms"] - bg["ttft_ms"] >= interactive["total_ms"], (bg, interactive)
    assert bg["queue_wait_ms"] <= bg["ttft_ms"]  # its first admission's wait: the time parked is in total_ms


class CrashOnDemand(SimWorker):
    """The first worker dies (an exception out of its loop) at its next engine call once
    ``crash`` is set; the in-process transport starts a second one and submits its jobs again."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.crash = threading.Event()
        self.made = 0

    def make_worker(self) -> EngineWorker:
        worker = super().make_worker()
        self.made += 1
        if self.made == 1:
            engine = cast(SimEngine, worker.engine)
            slow = engine.on_call

            def call(n: int) -> None:
                if slow is not None:
                    slow(n)
                if self.crash.is_set():
                    raise RuntimeError("simulated worker crash")

            engine.on_call = call
        return worker


@pytest.mark.parametrize("stream", [True, False])
async def test_a_job_submitted_again_after_a_crash_has_the_preemptions_of_both_workers(stream: bool) -> None:
    """A background chat is preempted once by its first worker, which then crashes; the second
    worker preempts it once more and it finishes there. Its row says 2."""
    sim = CrashOnDemand(lanes=1, step_sleep_s=0.004)
    async with attached(sim) as (link, _rt):
        known: set[str] = set()
        background = await opened(chat_body("x", max_tokens=150, stream=stream), qos("background"))
        job = await one_job(link, known)
        await until(lambda: job.delivered_tokens > 0, lambda: "the background job never ran")
        assert (await request("POST", "/v1/chat/completions", chat_body("y", max_tokens=5), qos("interactive"), timeout_s=30)).status == 200
        await until(lambda: job.preemptions == 1, lambda: "the first worker's preemption never reached the head")
        sim.crash.set()
        await until(lambda: link.restarts == 1 and link.connected, lambda: "the worker was not started again")
        await until(lambda: job.preemptions_lost == 1 and job.delivered_tokens > 0 and generated(link, job) > 0,
                    lambda: "the job never ran on the second worker")
        assert (await request("POST", "/v1/chat/completions", chat_body("z", max_tokens=5), qos("interactive"), timeout_s=30)).status == 200
        assert await answered(background) == 200
    [bg] = await rows_of(job)
    assert (bg["qos_class"], bg["status"], bg["completion_tokens"]) == ("background", 200, 150), bg
    assert bg["preemptions"] == 2, bg


@pytest.mark.parametrize("stream", [True, False])
async def test_a_request_that_waited_for_its_worker_to_come_back_has_that_wait_in_its_times(stream: bool) -> None:
    """The worker restarts (it left; the next one starts a second later). A request that arrived
    meanwhile waited for it at the web side: its row counted from when the new worker got it, a
    queue wait and time to first token of about nothing, though the client waited a second.
    The wait now reaches the worker as a wait at the router does (the Submit's waited_ms)."""
    async with attached(SimWorker(lanes=1, step_sleep_s=0.02)) as (link, _rt):  # (its job lives long enough to be seen)
        link.restart_delay_s = 1.0
        worker = link.worker
        worker.drain()  # it stops once idle; the transport starts the next one after the delay
        await until(lambda: not link.connected, lambda: "the worker never left")
        began = time.monotonic()
        known: set[str] = set(link.inflight)
        comm = await opened(chat_body("x", max_tokens=5, stream=stream), qos("agent"))
        job = await one_job(link, known)
        waited_ms = (time.monotonic() - began) * 1000
        assert link.worker is not worker and waited_ms >= 500, waited_ms
        assert await answered(comm) == 200
    [row] = await rows_of(job)
    assert row["queue_wait_ms"] >= 500 and row["ttft_ms"] >= row["queue_wait_ms"] and row["total_ms"] >= row["ttft_ms"], row


# -- waited for its start deadline, or left while queued ---------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_a_completion_whose_start_deadline_passed_while_queued_is_a_503_with_the_time_it_waited(stream: bool) -> None:
    """One lane, an interactive chat generating; a completion-class request queued behind it
    (it may not preempt an interactive lane) misses its start deadline (``--completion-deadline-ms``):
    503 ``completion_deadline_exceeded``, streamed or not, and its row has the class, the error,
    the time it was open, and no queue wait or first token (it was never admitted)."""
    async with attached(ConfiguredSim(lanes=1, completion_deadline_ms=300, step_sleep_s=0.004)) as (link, _rt):
        known: set[str] = set()
        first, first_job = await generating(link, known, "a", 60, "interactive")
        late = await opened(json.dumps({"model": MODEL, "prompt": "def f(", "max_tokens": 8, "stream": stream}).encode(), qos("completion"),
                            path="/v1/completions")
        late_job = await one_job(link, known)
        assert await answered(late) == 503
        assert await answered(first) == 200
        assert link.worker.scheduler.counters["deadline_expired"] == 1
    [row] = await rows_of(late_job)
    assert (row["endpoint"], row["qos_class"], row["stream"]) == ("completions", "completion", stream), row
    assert (row["status"], row["error_code"]) == (503, "completion_deadline_exceeded"), row
    assert row["queue_wait_ms"] is None and row["ttft_ms"] is None and row["completion_tokens"] is None, row
    assert row["total_ms"] is not None and row["total_ms"] > 0 and row["preemptions"] == 0, row


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_that_leaves_while_queued_has_the_time_it_waited_and_no_tokens(stream: bool) -> None:
    """One lane busy; a second request queues behind it and its client leaves. Its row: the
    time it was open (total_ms: all of it queued), ``client_disconnected``, no queue wait, first
    token or tokens (it never reached a lane), no preemption. A stream's status is the 200 it
    had sent (a stream's headers go before its job is admitted); one not streamed: 499."""
    async with attached(SimWorker(lanes=1, step_sleep_s=0.004)) as (link, _rt):
        known: set[str] = set()
        first, first_job = await generating(link, known, "a", 60, "agent")
        waiting = await opened(chat_body("b", max_tokens=8, stream=stream), qos("agent"))
        waiting_job = await one_job(link, known)
        await queued_at_the_worker(link, waiting_job)
        if stream:  # its headers went out once the worker had it (queued): the client has its 200
            assert (await waiting.receive_output(10))["status"] == 200
        await left(waiting)
        await until(lambda: waiting_job.job_id not in link.inflight, lambda: "the queued job was not cancelled")
        assert await answered(first) == 200
    [row] = await rows_of(waiting_job)
    assert (row["status"], row["error_code"]) == ((200 if stream else 499), "client_disconnected"), row
    assert row["queue_wait_ms"] is None and row["ttft_ms"] is None and row["completion_tokens"] is None, row
    assert row["total_ms"] is not None and row["total_ms"] > 0 and row["preemptions"] == 0, row
    assert (row["qos_class"], row["stream"]) == ("agent", stream)


# -- refused: a limit, a full queue, no engine ----------------------------------------------------

NO_WAITS = {"queue_wait_ms": None, "ttft_ms": None, "serial_queue_wait_ms": None, "serial_score": None, "preemptions": 0, "completion_tokens": None}


@pytest.mark.parametrize("limit", ["key_rate", "key_concurrency", "client_concurrency"])
async def test_a_request_refused_for_a_limit_has_a_row_with_its_code_class_and_no_waits(limit: str) -> None:
    """429 for the key's rate, the key's requests in flight or a keyless client's: a row with the
    status, the code, the class and priority decided, the time it was open, and no wait of any
    kind (it never queued). (The rate-limit row's class: tests/observability/test_activity_rows.py.)"""
    from keys.credentials import digest_of
    from keys.snapshot import Key, Policy

    secret = "sf-test-why-0123456789"
    policy = Policy(name="limited", rate_limit_rpm=1 if limit == "key_rate" else 0, max_concurrent=1 if limit == "key_concurrency" else 0)
    keys = {digest_of(secret): Key(id=1, name="limited", digest=digest_of(secret), policy=policy)}
    headers = qos("agent") if limit == "client_concurrency" else [*qos("agent"), (b"authorization", f"Bearer {secret}".encode())]
    code = "rate_limit_exceeded" if limit == "key_rate" else "concurrency_limit_exceeded"
    with override_settings(SUPERFLUID_CLIENT_CONCURRENCY=1 if limit == "client_concurrency" else 32):
        async with attached(SimWorker(step_sleep_s=0.004), keys=keys) as (link, _rt):
            first = await opened(chat_body("a", max_tokens=40, stream=True), headers)
            first_job = await one_job(link, set())
            refused = await request("POST", "/v1/chat/completions", chat_body("b", max_tokens=4), headers)
            assert refused.status == 429 and refused.json()["error"]["code"] == code, refused.body
            assert await answered(first) == 200
    found = {r["request_id"]: r for r in await rows()}
    served, row = found[first_job.job_id], found[refused.headers["x-request-id"]]
    assert (row["status"], row["error_code"]) == (429, code), row
    assert (row["qos_class"], row["priority"], row["band"]) == (served["qos_class"], served["priority"], served["band"]) == ("agent", 0, "normal")
    assert {k: row[k] for k in NO_WAITS} == NO_WAITS, row
    assert row["total_ms"] is not None


@override_settings(SUPERFLUID_MAX_BATCH=1, SUPERFLUID_MAX_QUEUE=1)
async def test_a_request_refused_for_a_full_queue_has_a_row_with_queue_full_and_no_waits() -> None:
    """One lane and ``--max-queue 1``: one request runs, one waits, the third is 503
    ``queue_full``: its row has the code, its class, and no wait (it never queued)."""
    async with attached(SimWorker(lanes=1, step_sleep_s=0.004)) as (link, _rt):
        running = await opened(chat_body("a", max_tokens=40, stream=True), qos("background"))
        await one_job(link, set())
        waiting = await opened(chat_body("b", max_tokens=4, stream=True), qos("background"))
        await until(lambda: len(link.inflight) == 2, lambda: "the second request was never submitted")
        full = await request("POST", "/v1/chat/completions", chat_body("c", max_tokens=4), qos("background"))
        assert full.status == 503 and full.json()["error"]["code"] == "queue_full", full.body
        assert [await answered(c) for c in (running, waiting)] == [200, 200]
    [row] = [r for r in await rows() if r["request_id"] == full.headers["x-request-id"]]
    assert (row["status"], row["error_code"], row["qos_class"]) == (503, "queue_full", "background"), row
    assert {k: row[k] for k in NO_WAITS} == NO_WAITS, row


# -- several models: the router ------------------------------------------------------------------

ROUTER_WAIT_S, ROUTER_SCORE = 2.5, 12.5


def router_that_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several models: a router that dispatches every request as having waited ROUTER_WAIT_S (a
    swap) and won with ROUTER_SCORE, to the in-process worker."""
    from scheduler.core.router import Dispatch
    from superfluid_site.runtime import get_link

    async def acquire(model: str, priority: int, _jobs: int) -> Any:
        from scheduler.core.qos import band_of

        return get_link(), Dispatch("r", model, priority, band_of(priority), ROUTER_SCORE, ROUTER_WAIT_S), 1

    stand_in_pool(monkeypatch, acquire)


async def test_a_request_that_waited_at_the_router_and_then_at_its_worker_has_both_waits_and_the_routers_score(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several models, one lane: each request waited at the router (a swap), then the second
    waited in its worker's queue behind the first, and the third's client left while queued
    there. Every row has the router's decision (the score it won with, its priority and band);
    the wait is the router's plus the worker's (the worker counts both, told the router's), and
    for the one that left the router's alone (the worker never admitted it)."""
    router_that_waits(monkeypatch)
    async with attached(SimWorker(lanes=1, step_sleep_s=0.004)) as (link, _rt):
        known: set[str] = set()
        first, first_job = await generating(link, known, "a", 40, "agent")
        second = await opened(chat_body("b", max_tokens=4), qos("agent"))
        await queued_at_the_worker(link, second_job := await one_job(link, known))
        left_of_first = 40 - generated(link, first_job)  # at most the tokens still to come when the second arrived
        third = await opened(chat_body("c", max_tokens=4), qos("agent"))
        await queued_at_the_worker(link, third_job := await one_job(link, known))
        await left(third)
        assert [await answered(c) for c in (first, second)] == [200, 200]
    ran, waited, gone = await rows_of(first_job, second_job, third_job)
    for row in (ran, waited, gone):
        assert (row["serial_score"], row["serial_priority"], row["serial_band"]) == (ROUTER_SCORE, row["priority"], row["band"]), row
    assert ran["serial_queue_wait_ms"] == ran["queue_wait_ms"] == ROUTER_WAIT_S * 1000, ran
    assert waited["queue_wait_ms"] >= ROUTER_WAIT_S * 1000 + (left_of_first - 1) * DECODE_ROUND_MS, (waited, left_of_first)
    assert waited["serial_queue_wait_ms"] == round(waited["queue_wait_ms"]), waited
    assert waited["ttft_ms"] >= waited["queue_wait_ms"], waited
    assert (gone["status"], gone["error_code"], gone["serial_queue_wait_ms"]) == (499, "client_disconnected", ROUTER_WAIT_S * 1000), gone
    assert gone["queue_wait_ms"] is None and gone["ttft_ms"] is None, gone


async def test_a_request_the_router_has_no_engine_for_is_a_503_with_its_class_and_no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several models, and the model cannot be loaded: 503 ``engine_unavailable``, a row with
    the class decided and no wait (no dispatch: no serial decision either)."""
    from scheduler.link.pool import ModelUnavailable

    async def acquire(model: str, _priority: int, _jobs: int) -> Any:
        raise ModelUnavailable(model, f"The model {model!r} could not be loaded.")

    stand_in_pool(monkeypatch, acquire)
    async with attached(SimWorker()):
        reply = await request("POST", "/v1/chat/completions", chat_body("a", max_tokens=4), qos("agent"))
        assert reply.status == 503 and reply.json()["error"]["code"] == "engine_unavailable", reply.body
    [row] = await rows()
    assert (row["status"], row["error_code"], row["qos_class"]) == (503, "engine_unavailable", "agent"), row
    assert {k: row[k] for k in NO_WAITS} == NO_WAITS, row
    assert row["serial_priority"] is None and row["serial_band"] == ""


# -- streamed or not ------------------------------------------------------------------------------


async def test_a_streamed_and_a_whole_reply_have_the_same_fields_on_their_rows() -> None:
    """The same request streamed and not: the same fields filled, the same values for all but
    the times and ``stream`` (times: the simulated engine's; the second may reuse a cached
    prefix, so only whether each is there is compared)."""
    async with attached(SimWorker(lanes=1)):
        streamed = await request("POST", "/v1/chat/completions", chat_body("same", max_tokens=12, stream=True), qos("agent"))
        whole = await request("POST", "/v1/chat/completions", chat_body("same", max_tokens=12), qos("agent"))
        assert (streamed.status, whole.status) == (200, 200)
    s, w = await rows()
    assert (s["stream"], w["stream"]) == (True, False)
    assert {k for k, v in s.items() if v is None} == {k for k, v in w.items() if v is None} == set(), (s, w)
    same = ("qos_class", "priority", "band", "serial_priority", "serial_band", "prompt_tokens", "completion_tokens", "preemptions",
            "finish_reason", "status", "error_code", "endpoint")
    assert {k: s[k] for k in same} == {k: w[k] for k in same}, (s, w)
    for row in (s, w):
        assert row["queue_wait_ms"] <= row["ttft_ms"] <= row["total_ms"] and row["serial_queue_wait_ms"] == row["queue_wait_ms"], row


async def test_a_streamed_request_of_several_choices_has_one_row_with_its_first_admitted_choices_waits() -> None:
    """n=3 on one lane, streamed (tests/observability/test_activity_rows.py and
    tests/edge/test_middle_layer.py pin the reply not streamed): one row, whose queue wait, first
    token and serial wait are the choice admitted first's (the others waited behind it), its
    tokens every choice's."""
    async with attached(SimWorker(lanes=1)):
        reply = await request("POST", "/v1/chat/completions", chat_body("x", n=3, max_tokens=30, stream=True), qos("agent"), timeout_s=30)
        assert reply.status == 200
    [row] = await rows()
    assert (row["stream"], row["status"], row["completion_tokens"], row["finish_reason"], row["preemptions"]) == (True, 200, 90, "length", 0), row
    assert row["queue_wait_ms"] * 3 < row["total_ms"] and row["ttft_ms"] * 3 < row["total_ms"], row
    assert row["serial_queue_wait_ms"] == row["queue_wait_ms"], row


# -- what the admin's list shows -------------------------------------------------------------------


def test_the_admin_list_shows_the_time_a_request_was_open_and_its_wait_at_the_router(admin_client: Any) -> None:
    """The rows of requests that never had their worker's answer (a client that left while
    queued, a missed start deadline, a refusal) have one time: total_ms, how long they were open;
    and a request that waited at the router (a swap) and left before its worker admitted it has
    that wait in serial_queue_wait_ms alone. The admin's list showed neither column: such a row
    read as a request that never waited at all (only its detail page had them)."""
    ActivityEntry.objects.create(endpoint="chat", request_id="left", qos_class="agent", status=499, error_code="client_disconnected",
                                 serial_score=12.5, serial_queue_wait_ms=2345.0, total_ms=43210.5)
    page = admin_client.get("/admin/activity/activityentry/")
    assert page.status_code == 200
    table = page.content.decode().split('id="result_list"')[1].split("</table>")[0]
    header, body = table.split("</thead>")
    assert "Total ms" in header and "Serial queue wait ms" in header, header
    assert "43210.5" in body and "2345.0" in body, body
