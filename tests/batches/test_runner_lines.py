"""A batch's lines through the runner (batches/runner.py) and the real consumers, in this process,
against the simulated engine (the middle layer of tests/edge/inproc.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from batches import runner
from batches.models import Batch, File, Line
from tests.edge.inproc import SimWorker, attached

pytestmark = pytest.mark.django_db(transaction=True)


def make_batch(n: int) -> Batch:
    f = File.objects.create(purpose="batch", filename="in.jsonl", bytes=1, content=b"x", owner="")
    b = Batch.objects.create(endpoint="/v1/completions", input_file=f, owner="", total=n)
    body = {"model": "sim", "prompt": "once upon a time", "max_tokens": 4}
    Line.objects.bulk_create([Line(batch=b, index=i, custom_id=f"c{i}", body=body) for i in range(n)])
    runner.begin(b.id)
    return b


async def test_a_line_is_recorded_when_its_reply_is_in_not_at_the_next_look_for_a_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A running line looks for a cancel every POLL_S. The wait between two looks used to end
    only when the consumer had ended too, which is after the reply: every line took at least
    POLL_S (half a second), whatever its length. Here a look is an hour apart: the lines must
    not wait for one (the bound only stops a hang)."""
    monkeypatch.setattr(runner, "POLL_S", 3600.0)
    # the activity log's rows are kept here: its writer thread's connection and the runner's
    # share the test's in-memory database, where one's write fails the other's as "locked"
    rows: list[dict[str, object]] = []
    monkeypatch.setattr("activity.writer.submit", rows.append)
    b = await sync_to_async(make_batch)(3)
    async with attached(SimWorker()):
        for _ in range(3):
            assert await asyncio.wait_for(runner.run_next(b.id), 30)
        assert not await asyncio.wait_for(runner.run_next(b.id), 30)  # none left
    b = await Batch.objects.select_related("output_file").aget(pk=b.id)
    assert (b.status, b.completed, b.failed) == ("completed", 3, 0)
    out = [json.loads(x) for x in bytes(b.output_file.content).decode().splitlines()]
    assert [o["custom_id"] for o in out] == ["c0", "c1", "c2"]
    assert all(o["response"]["status_code"] == 200 and o["response"]["body"]["choices"][0]["text"] for o in out)
    assert len(rows) == 3  # each line's request was logged


async def test_a_line_whose_result_cannot_be_written_runs_again_and_the_batch_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The database errs once while a line's result is written (and once while a line is
    claimed). The runner's claimer used to die with the error, and with every claimer gone the
    batch stayed ``in_progress`` for good. Now the line is given up and run again."""
    from django.db import OperationalError

    rows: list[dict[str, object]] = []
    monkeypatch.setattr("activity.writer.submit", rows.append)
    monkeypatch.setattr(runner, "FAILED_LINE_PAUSE_S", 0.01)
    real_record, real_claim = runner.record, runner.claim
    failures = {"record": 1, "claim": 1}

    def flaky(name: str, real: Any) -> Any:
        def call(*args: Any) -> Any:
            if failures[name]:
                failures[name] -= 1
                raise OperationalError("database is locked")
            return real(*args)

        return call

    monkeypatch.setattr(runner, "record", flaky("record", real_record))
    monkeypatch.setattr(runner, "claim", flaky("claim", real_claim))
    monkeypatch.setattr(runner, "concurrency", lambda: 2)
    b = await sync_to_async(make_batch)(4)
    async with attached(SimWorker()):
        await asyncio.wait_for(runner.run_batch(b.id), 30)
    assert failures == {"record": 0, "claim": 0}
    b = await Batch.objects.select_related("output_file").aget(pk=b.id)
    assert (b.status, b.completed, b.failed) == ("completed", 4, 0)
    out = [json.loads(x) for x in bytes(b.output_file.content).decode().splitlines()]
    assert [o["custom_id"] for o in out] == ["c0", "c1", "c2", "c3"]  # each line once
    assert len(rows) == 5  # the line whose result was lost ran twice


async def test_a_client_that_leaves_while_its_batch_is_created_still_gets_the_batch_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a large input file takes a while; a client that disconnects meanwhile makes Django
    cancel the view. The batch was created all the same (in its thread) and never started: it
    stayed "validating" for good. Now creating and starting go on without the client."""
    from channels.testing import ApplicationCommunicator

    from tests.edge.inproc import JSON, application, scope

    rows: list[dict[str, object]] = []
    monkeypatch.setattr("activity.writer.submit", rows.append)
    real_start = runner.start
    creating, left = asyncio.Event(), asyncio.Event()

    async def start_once_the_client_has_left(batch_id: str) -> None:
        creating.set()  # the batch is being created (a large file read) ...
        await left.wait()  # ... and its client leaves before it is started
        await real_start(batch_id)

    monkeypatch.setattr(runner, "start", start_once_the_client_has_left)
    f = await File.objects.acreate(purpose="batch", filename="in.jsonl", bytes=1, owner="",
                                   content=b"".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                                                                "body": {"model": "sim", "prompt": "hi", "max_tokens": 3}}).encode() + b"\n" for i in range(2)))
    async with attached(SimWorker()):
        comm = ApplicationCommunicator(application(), scope("POST", "/v1/batches", JSON))
        await comm.send_input({"type": "http.request", "body": json.dumps({"input_file_id": f.id, "endpoint": "/v1/completions", "completion_window": "24h"}).encode()})
        await asyncio.wait_for(creating.wait(), 30)
        await comm.send_input({"type": "http.disconnect"})
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await comm.wait(5)
        left.set()
        for _ in range(1500):  # up to 30 s: a loaded CI machine once needed more than 5
            b = await Batch.objects.filter(input_file_id=f.id).afirst()
            if b is not None and b.status == "completed":
                break
            await asyncio.sleep(0.02)
        assert b is not None and (b.status, b.completed) == ("completed", 2), b and b.status


async def test_a_line_waiting_on_a_429_runs_under_its_key_as_it_is_at_the_next_try(monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner's key was looked up once per line: a line retried after 429s kept running under
    a key revoked (or narrowed) meanwhile. Here the key is revoked after the first 429."""
    from keys.snapshot import Key, Snapshot
    from superfluid_site.runtime import key_runtime

    monkeypatch.setattr("activity.writer.submit", lambda _row: None)
    b = await sync_to_async(make_batch)(1)
    await Batch.objects.filter(pk=b.id).aupdate(owner="ci")
    tries: list[object] = []

    async def refused(_b: Batch, _line: Line, principal: object) -> tuple[int, dict[str, str], bytes]:
        tries.append(principal)
        rt = key_runtime()
        rt.snapshot = Snapshot(version=rt.snapshot.version + 1, keys_by_digest={})  # revoked, and gone
        return 429, {"retry-after": "0"}, b"{}"

    async with attached(SimWorker(), keys={"d" * 64: Key(id=1, name="ci", digest="d" * 64)}):
        monkeypatch.setattr(runner, "_call", refused)
        line = await Line.objects.aget(batch_id=b.id, index=0)
        ok, out = await asyncio.wait_for(runner.run_line(await Batch.objects.aget(pk=b.id), line), 30)
    assert len(tries) == 1 and not ok
    assert out is not None and out["response"]["status_code"] == 401


RETRIED = ("engine_unavailable", "queue_full")  # no engine for now, or --max-queue reached


@pytest.mark.parametrize(("code", "tries"), [("engine_crashed", 1), ("deadline_exceeded", 1), ("engine_unavailable", 2), ("queue_full", 2)])
async def test_only_a_503_with_no_engine_for_now_is_tried_again(monkeypatch: pytest.MonkeyPatch, code: str, tries: int) -> None:
    """Every 503 used to be retried: a line whose job crashed the worker twice (``engine_crashed``)
    was sent again and again, crashing it each time, and the batch never ended."""
    b = await sync_to_async(make_batch)(1)
    calls: list[int] = []

    async def answered(_b: Batch, _line: Line, _principal: object) -> tuple[int, dict[str, str], bytes]:
        calls.append(1)
        if code in RETRIED and len(calls) == 1:
            return 503, {"retry-after": "0"}, json.dumps({"error": {"message": "no engine", "type": "server_error", "param": None, "code": code}}).encode()
        if code in RETRIED:
            return 200, {}, b'{"choices": []}'
        return 503, {"retry-after": "0"}, json.dumps({"error": {"message": "gone", "type": "server_error", "param": None, "code": code}}).encode()

    async with attached(SimWorker()):
        monkeypatch.setattr(runner, "_call", answered)
        line = await Line.objects.aget(batch_id=b.id, index=0)
        ok, out = await asyncio.wait_for(runner.run_line(await Batch.objects.aget(pk=b.id), line), 30)
    assert len(calls) == tries and out is not None
    assert ok is (code in RETRIED)
    if not ok:
        assert out["response"]["status_code"] == 503 and out["response"]["body"]["error"]["code"] == code


async def test_a_running_line_keeps_its_lease_renewed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease was set once, at the claim: a line still running when it lapsed (a long reply
    behind interactive traffic) was claimed by the next runner and ran twice."""
    monkeypatch.setattr(runner, "renew_s", lambda: 0.02)
    monkeypatch.setattr("activity.writer.submit", lambda _row: None)
    b = await sync_to_async(make_batch)(1)
    await Line.objects.filter(batch_id=b.id).aupdate(body={"model": "sim", "prompt": "once upon a time", "max_tokens": 12})
    async with attached(SimWorker(step_sleep_s=0.02)):
        claimed = await sync_to_async(runner.claim)(b.id)
        assert claimed is not None and claimed.claimed_until is not None
        ok, out = await asyncio.wait_for(runner.run_line(await Batch.objects.aget(pk=b.id), claimed), 30)
    assert ok and out is not None
    line = await Line.objects.aget(pk=claimed.pk)
    assert line.claimed_until is not None and line.claimed_until > claimed.claimed_until


async def test_a_batchs_lines_count_as_a_client_of_their_own() -> None:
    """Where a client's address would be (the per-IP rate bucket, a keyless client's slot), a
    line is its batch, not 127.0.0.1: one bucket for every key's batches and every loopback
    client (tests/keys/test_admission.py shows two batches' lines not sharing one)."""
    async with attached(SimWorker()):
        principal = await runner._principal("", "batch_x")
    assert principal.key is None and principal.client_ip == runner.batch_client("batch_x") == "batch:batch_x"


async def test_a_line_of_non_ascii_text_within_the_body_bound_is_not_refused_as_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    """A line's request was sent to its consumer as ``json.dumps`` writes it by default, every
    character past ASCII escaped (``\\u65e5``: six bytes for a kanji's three, twelve for an
    emoji's four): a line the same size as an HTTP request the server takes, the upload having
    taken it under the same bound, came back 413 ``request_too_large`` once its text was not
    ASCII. It is sent as UTF-8, as a client sends it."""
    from django.test import override_settings

    monkeypatch.setattr("activity.writer.submit", lambda _row: None)
    body = {"model": "sim", "prompt": "日本語😀" * 12, "max_tokens": 2}
    utf8 = len(json.dumps(body, ensure_ascii=False).encode())
    limit = utf8 + 50
    assert len(json.dumps(body).encode()) > limit  # escaped, it would not fit
    b = await sync_to_async(make_batch)(1)
    await Line.objects.filter(batch=b).aupdate(body=body)
    with override_settings(SUPERFLUID_MAX_BODY_BYTES=limit):
        async with attached(SimWorker()):
            assert await asyncio.wait_for(runner.run_next(b.id), 30)
    b = await Batch.objects.select_related("output_file", "error_file").aget(pk=b.id)
    assert b.error_file is None, bytes(b.error_file.content)
    assert (b.status, b.completed, b.failed) == ("completed", 1, 0)
