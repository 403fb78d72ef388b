"""The activity log: one row per request from record_request(), no text, retention, admin."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import logging
import threading
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from activity import log as activity_log
from activity import writer as activity_writer
from activity.models import ActivityEntry
from api.records import RequestRecord, access_line, record_request


def full_record() -> RequestRecord:
    return RequestRecord(
        endpoint="chat",
        request_id="abc123",
        model="SmolLM2",
        key_name="alice",
        client_ip="127.0.0.1",
        qos="interactive",
        priority=100,
        band="interactive",
        stream=True,
        status=200,
        finish_reason="stop",
        usage={"prompt_tokens": 40, "completion_tokens": 12, "cached_tokens": 32},
        timing={"queue_wait_ms": 1.5, "ttft_ms": 80.0, "total_ms": 400.0, "preemptions": 1},
        serial={"serial_priority": 100, "serial_band": "interactive", "serial_score": 110.0, "serial_queue_wait_ms": 1.5},
    )


@pytest.mark.django_db(transaction=True)
async def test_record_request_writes_one_row_with_every_field_and_no_text() -> None:
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda rec: lines.append(rec.getMessage())  # type: ignore[method-assign]
    access = logging.getLogger("superfluid.access")
    access.addHandler(handler)
    try:
        await record_request(full_record())
    finally:
        access.removeHandler(handler)
    assert await asyncio.to_thread(activity_writer.flush)
    rows = await sync_to_async(list)(ActivityEntry.objects.all())
    assert len(rows) == 1
    row = rows[0]
    assert (row.key_name, row.model, row.endpoint, row.qos_class, row.priority, row.band) == ("alice", "SmolLM2", "chat", "interactive", 100, "interactive")
    assert (row.serial_priority, row.serial_band, row.serial_score, row.serial_queue_wait_ms) == (100, "interactive", 110.0, 1.5)
    assert (row.queue_wait_ms, row.ttft_ms, row.total_ms, row.preemptions) == (1.5, 80.0, 400.0, 1)
    assert (row.prompt_tokens, row.cached_tokens, row.completion_tokens) == (40, 32, 12)
    assert (row.finish_reason, row.status, row.error_code, row.stream) == ("stop", 200, "", True)
    assert len(lines) == 1 and "key=alice" in lines[0] and "score=110.0" in lines[0] and "cached=32" in lines[0]


def test_the_model_has_no_field_that_could_hold_prompt_or_reply_text() -> None:
    names = {f.name for f in ActivityEntry._meta.get_fields()}
    assert not names & {"prompt", "messages", "content", "text", "reply", "completion", "suffix", "body"}
    for f in ActivityEntry._meta.get_fields():  # no text field without a short bound (a TextField has none)
        kind = f.get_internal_type()
        if kind in ("CharField", "GenericIPAddressField"):
            assert f.max_length is not None and f.max_length <= 200, f.name
        else:
            assert kind in {"BigAutoField", "DateTimeField", "BooleanField", "IntegerField", "PositiveSmallIntegerField", "FloatField"}, (f.name, kind)
    assert "Paris" not in access_line(full_record())


@pytest.mark.django_db(transaction=True)
async def test_an_error_record_is_stored_with_its_status_and_code() -> None:
    await record_request(RequestRecord(endpoint="completions", status=400, error_code="context_length_exceeded"))
    assert await asyncio.to_thread(activity_writer.flush)
    row = await ActivityEntry.objects.aget()
    assert (row.status, row.error_code, row.key_name, row.ttft_ms) == (400, "context_length_exceeded", "", None)


@pytest.mark.django_db
def test_prune_keeps_the_retention_window_and_the_command_reports_it(settings) -> None:  # type: ignore[no-untyped-def]
    settings.SUPERFLUID_ACTIVITY_RETENTION_DAYS = 30
    now = timezone.now()
    for days in (1, 29, 31, 400):
        ActivityEntry.objects.create(endpoint="chat", time=now - datetime.timedelta(days=days))
    assert activity_log.prune() == 2
    assert ActivityEntry.objects.count() == 2
    out = io.StringIO()
    call_command("pruneactivity", "--days", "7", stdout=out)
    assert "deleted 1 activity entries older than 7 days" in out.getvalue()
    assert ActivityEntry.objects.count() == 1
    settings.SUPERFLUID_ACTIVITY_RETENTION_DAYS = 0
    assert activity_log.prune() == 0  # 0 keeps everything


@pytest.mark.django_db
def test_writes_prune_at_most_once_an_hour(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(activity_log, "prune", lambda days=None, max_batches=None: calls.append(1) or 0)
    monkeypatch.setattr(activity_log, "_last_prune", None)
    monkeypatch.setattr(activity_log, "_pruning", False)
    activity_log.maybe_prune(now=1000.0)
    activity_log.maybe_prune(now=1000.0 + 1800)
    activity_log.maybe_prune(now=1000.0 + 3601)
    assert len(calls) == 2


@pytest.mark.django_db
def test_admin_browses_the_log_read_only_with_filters_and_search(admin_client: Client) -> None:
    ActivityEntry.objects.create(endpoint="chat", key_name="alice", qos_class="agent", status=200, finish_reason="stop")
    ActivityEntry.objects.create(endpoint="chat", key_name="bob", qos_class="background", status=429, error_code="rate_limit_exceeded")
    ActivityEntry.objects.create(endpoint="completions", qos_class="background", status=503, error_code="queue_full")

    def listed(query: str) -> str:
        page = admin_client.get("/admin/activity/activityentry/" + query)
        assert page.status_code == 200
        return page.content.decode().split('id="result_list"')[1].split("</table>")[0]

    results = listed("?qos_class=background")
    assert "rate_limit_exceeded" in results and "bob" in results and "alice" not in results
    assert "queue_full" in listed("?status_class=5xx") and "bob" not in listed("?status_class=5xx")
    assert "bob" in listed("?status_class=429") and "queue_full" not in listed("?status_class=429")
    assert "queue_full" in listed("?key_name=-") and "bob" not in listed("?key_name=-")
    assert "alice" in listed("?key_name=alice&endpoint=chat") and "bob" not in listed("?key_name=alice")
    week = timezone.now() - datetime.timedelta(days=7)
    assert "alice" in listed("?" + urlencode({"time__gte": str(week)}))  # the "past 7 days" filter
    assert admin_client.get("/admin/activity/activityentry/?q=alice").status_code == 200
    assert admin_client.get("/admin/activity/activityentry/add/").status_code == 403


def test_the_admin_lists_filter_values_without_reading_the_whole_log(admin_client: Client) -> None:
    """Django's filter of a plain column lists its values with a SELECT DISTINCT over the whole
    table, one per filter and page: on a month of rows (millions) each page took seconds. The
    values listed are fixed ones, or those of the last day (a range of the time index)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    old = timezone.now() - datetime.timedelta(days=3)
    ActivityEntry.objects.create(time=old, endpoint="chat", key_name="gone", model="old-model", status=200)
    ActivityEntry.objects.create(endpoint="chat", key_name="alice", model="new-model", status=200, error_code="")
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get("/admin/activity/activityentry/")
    sidebar = page.content.decode().split('id="changelist-filter"')[1]
    assert "new-model" in sidebar and "alice" in sidebar and "old-model" not in sidebar
    distinct = [q["sql"] for q in queries.captured_queries if "DISTINCT" in q["sql"].upper()]
    assert distinct and all('"time" >=' in sql for sql in distinct), distinct
    assert "old-model" in admin_client.get("/admin/activity/activityentry/?model=old-model").content.decode()  # still found


@pytest.mark.django_db(transaction=True)
async def test_a_priority_beyond_int64_is_stored_clamped_not_lost() -> None:
    # a 400-digit X-LlamaSwap-Priority once lost its row (SQLite OverflowError); PostgreSQL's
    # IntegerField fails from 2**31: every integer column is clamped into int32
    record = full_record()
    record.priority, record.serial = 10**400, {"serial_priority": -(10**30), "serial_score": float("inf")}
    await record_request(record)
    assert await asyncio.to_thread(activity_writer.flush)
    row = await ActivityEntry.objects.aget()
    assert (row.priority, row.serial_priority, row.serial_score) == (2**31 - 1, -(2**31), None)


@contextlib.contextmanager
def stuck_database() -> Iterator[threading.Event]:
    """The activity writer's database write waits until the event yielded is set."""
    gate = threading.Event()
    real_store = activity_writer._store

    def held_store(rows, touches):  # type: ignore[no-untyped-def]
        gate.wait(10)
        real_store(rows, touches)

    activity_writer._store = held_store  # type: ignore[assignment]
    try:
        yield gate
    finally:
        activity_writer._store = real_store  # type: ignore[assignment]
        gate.set()


@pytest.mark.django_db(transaction=True)
async def test_recording_a_burst_never_waits_on_the_database_and_loses_no_row() -> None:
    # record_request() only queues: the activity writer's own thread stores the rows in batches
    writer = activity_writer.get_writer()
    with stuck_database() as gate:  # until the burst has been recorded
        for i in range(300):
            await record_request(RequestRecord(endpoint="chat", request_id=f"r{i}", status=499))
        assert await ActivityEntry.objects.acount() == 0  # nothing was written while the burst was recorded
        gate.set()
        assert await asyncio.to_thread(writer.flush)
    assert await ActivityEntry.objects.acount() == 300
    assert {r async for r in ActivityEntry.objects.values_list("request_id", flat=True)} == {f"r{i}" for i in range(300)}


@pytest.mark.django_db(transaction=True)
async def test_a_write_that_fails_after_its_rows_is_written_again_without_doubling_them(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The writer stores a batch of rows, the keys' last-used times, then prunes once an hour.
    A failure after the rows (the prune's DELETE timed out, a connection dropped) made it write
    the whole batch again: every row twice, and the failed prune said nothing."""
    calls = {"n": 0}

    def prune(days=None, max_batches=None):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        raise RuntimeError("canceling statement due to statement timeout")

    monkeypatch.setattr(activity_log, "prune", prune)
    monkeypatch.setattr(activity_log, "_last_prune", None)
    monkeypatch.setattr(activity_log, "_pruning", False)
    logger = logging.getLogger("superfluid.activity")  # it does not propagate to the root
    monkeypatch.setattr(logger, "handlers", [*logger.handlers, caplog.handler])
    for i in range(3):
        await record_request(RequestRecord(endpoint="chat", request_id=f"p{i}", status=200))
    assert await asyncio.to_thread(activity_writer.get_writer().flush)
    assert sorted([r async for r in ActivityEntry.objects.values_list("request_id", flat=True)]) == ["p0", "p1", "p2"]
    assert calls["n"] == 1 and "could not prune the activity log" in caplog.text


@pytest.mark.django_db(transaction=True)
async def test_a_row_the_database_refuses_costs_only_itself_not_its_batch() -> None:
    """The writer stores up to 500 rows in one INSERT: one row the database refused for its data
    (here a negative status, which the column's CHECK refuses) lost every row of its batch."""
    writer = activity_writer.get_writer()
    with stuck_database() as gate:  # the rows queue up behind the first write: a batch
        for i, status in enumerate((200, -1, 200)):
            writer.submit({**activity_log.entry_fields(RequestRecord(endpoint="chat", request_id=f"b{i}", status=200)), "status": status})
        gate.set()
        assert await asyncio.to_thread(writer.flush)
    assert sorted([r async for r in ActivityEntry.objects.values_list("request_id", flat=True)]) == ["b0", "b2"]


def test_token_counts_that_come_as_floats_are_stored_as_integers_clamped() -> None:
    record = full_record()
    record.usage = {"prompt_tokens": 12.0, "completion_tokens": 1e12, "cached_tokens": float("nan")}
    record.timing = {"preemptions": float("inf")}
    fields = activity_log.entry_fields(record)
    assert (fields["prompt_tokens"], fields["completion_tokens"], fields["cached_tokens"], fields["preemptions"]) == (12, 2**31 - 1, None, 0)
    assert isinstance(fields["prompt_tokens"], int)


@pytest.mark.django_db(transaction=True)
async def test_a_refused_row_does_not_take_its_batchs_key_last_used_times_with_it() -> None:
    """Written row by row, the keys' last-used times rode with the first row: when that row was
    the one the database refused, they were given up with it."""
    from keys.models import ApiKey

    key = await ApiKey.objects.acreate(name="k", prefix="sf-k", digest="k" * 64)
    when = timezone.now()
    bad, good = ({**activity_log.entry_fields(RequestRecord(endpoint="chat", request_id=f"t{i}", status=200)), "status": status}
                 for i, status in enumerate((-1, 200)))
    writer = activity_writer.ActivityWriter()  # one batch, as the writer's thread takes it
    await asyncio.to_thread(writer._write, [bad, good], {key.pk: when})
    assert [r async for r in ActivityEntry.objects.values_list("request_id", flat=True)] == ["t1"]
    assert (writer.written, writer.failed) == (1, 1)
    assert (await ApiKey.objects.aget(pk=key.pk)).last_used == when
