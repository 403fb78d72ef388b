"""A batch's state in the database: lines leased to one runner at a time, results counted once
(a redelivered Celery task never counts a line twice), files written in input order, a cancel
that waits for lines in flight."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from batches import runner
from batches.models import Batch, File, Line

pytestmark = pytest.mark.django_db


def make_batch(n: int) -> Batch:
    f = File.objects.create(purpose="batch", filename="in.jsonl", bytes=1, content=b"x", owner="k")
    b = Batch.objects.create(endpoint="/v1/completions", input_file=f, owner="k", total=n)
    Line.objects.bulk_create([Line(batch=b, index=i, custom_id=f"c{i}", body={}) for i in range(n)])
    return b


def result(custom_id: str, status: int) -> dict:
    return {"id": "batch_req_x", "custom_id": custom_id, "response": {"status_code": status, "request_id": "r", "body": {}}, "error": None}


def test_nothing_is_claimed_before_the_batch_is_in_progress_and_each_line_once() -> None:
    b = make_batch(3)
    assert runner.claim(b.id) is None  # still validating
    runner.begin(b.id)
    claimed = [runner.claim(b.id) for _ in range(4)]
    assert [line.index if line else None for line in claimed] == [0, 1, 2, None]


def test_a_lapsed_lease_is_claimed_again() -> None:
    b = make_batch(1)
    runner.begin(b.id)
    line = runner.claim(b.id)
    assert line is not None and runner.claim(b.id) is None
    Line.objects.filter(pk=line.pk).update(claimed_until=timezone.now() - timedelta(seconds=1))  # its runner died
    again = runner.claim(b.id)
    assert again is not None and again.pk == line.pk


def test_a_result_is_counted_once_and_the_files_keep_input_order() -> None:
    b = make_batch(3)
    runner.begin(b.id)
    lines = [runner.claim(b.id) for _ in range(3)]
    runner.record(lines[2].pk, True, result("c2", 200))
    runner.record(lines[2].pk, False, result("c2", 500))  # a redelivered task: ignored
    runner.record(lines[1].pk, False, result("c1", 400))
    assert not runner.finalize_if_done(b.id)  # c0 is still pending
    runner.record(lines[0].pk, True, result("c0", 200))
    assert runner.finalize_if_done(b.id)
    assert not runner.finalize_if_done(b.id)  # only one finalizes
    b.refresh_from_db()
    assert (b.status, b.completed, b.failed) == ("completed", 2, 1)
    assert b.finalizing_at is not None and b.completed_at is not None
    assert [json.loads(x)["custom_id"] for x in bytes(b.output_file.content).decode().splitlines()] == ["c0", "c2"]
    assert [json.loads(x)["response"]["status_code"] for x in bytes(b.error_file.content).decode().splitlines()] == [400]
    assert b.output_file.owner == "k" and b.output_file.purpose == "batch_output"


def test_cancel_waits_for_lines_in_flight_then_keeps_what_finished() -> None:
    b = make_batch(3)
    runner.begin(b.id)
    first, second = runner.claim(b.id), runner.claim(b.id)
    runner.record(first.pk, True, result("c0", 200))
    assert runner.cancel(b.id)[0].status == "cancelling"  # c1 is in flight
    assert runner.claim(b.id) is None  # nothing new starts
    Line.objects.filter(pk=second.pk).update(claimed_until=None)  # its runner gave it up (cancelled)
    assert runner.finalize_if_done(b.id)
    b.refresh_from_db()
    assert (b.status, b.completed, b.failed) == ("cancelled", 1, 0)
    assert b.cancelled_at is not None and b.error_file is None
    assert [json.loads(x)["custom_id"] for x in bytes(b.output_file.content).decode().splitlines()] == ["c0"]
    assert runner.cancel(b.id)[0].status == "cancelled"  # again: nothing changes


def test_cancel_before_any_line_ran_is_cancelled_at_once() -> None:
    b = make_batch(2)
    runner.begin(b.id)
    b = runner.cancel(b.id)[0]
    assert b.status == "cancelled" and b.output_file is None and b.error_file is None


def test_a_batch_shows_only_the_apis_statuses_while_its_files_are_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader between the start and the end of the finalization (its files are written in one
    transaction) sees a status of the Batch API's; a cancel's used to be ``finalizing_cancel``,
    which no client knows and which PostgreSQL refuses (the field holds 16 characters)."""
    seen: list[str] = []
    create = File.objects.create

    def watching(**kw: object) -> File:
        seen.append(Batch.objects.get(pk=b.id).status)
        return create(**kw)

    for cancel in (False, True):
        b = make_batch(1)
        runner.begin(b.id)
        line = runner.claim(b.id)
        runner.record(line.pk, True, result("c0", 200))
        if cancel:
            Batch.objects.filter(pk=b.id).update(status="cancelling")
        monkeypatch.setattr(File.objects, "create", watching)
        assert runner.finalize_if_done(b.id) and not runner.finalize_if_done(b.id)
        monkeypatch.undo()
        b.refresh_from_db()
        assert b.status == ("cancelled" if cancel else "completed")
    assert seen == ["finalizing", "cancelled"]
    assert all(s in Batch.STATUSES and len(s) <= Batch._meta.get_field("status").max_length for s in seen)


def test_a_batch_past_its_window_expires_keeping_what_finished() -> None:
    """``expires_at`` was shown and never acted on: a batch stuck behind other work ran for ever.
    Past it, no new line starts, the line in flight winds down as in a cancel, and the batch
    ends ``expired``: what finished in the output file, the rest as ``batch_expired`` errors."""
    from batches.views import batch_object

    b = make_batch(4)
    runner.begin(b.id)
    first, second, third = runner.claim(b.id), runner.claim(b.id), runner.claim(b.id)
    runner.record(first.pk, True, result("c0", 200))
    runner.record(second.pk, False, result("c1", 400))
    Batch.objects.filter(pk=b.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert runner.claim(b.id) is None  # nothing new starts
    b.refresh_from_db()
    assert b.status == "cancelling" and b.expired_at is not None
    assert batch_object(b)["status"] == "finalizing"  # nobody cancelled it
    assert runner.cancel(b.id)[0].status == "cancelling" and not runner.finalize_if_done(b.id)  # c2 in flight
    Line.objects.filter(pk=third.pk).update(claimed_until=None)  # its runner saw the expiry and gave it up
    assert runner.finalize_if_done(b.id)
    b = Batch.objects.select_related("output_file", "error_file").get(pk=b.id)
    shown = batch_object(b)
    assert (shown["status"], shown["request_counts"]) == ("expired", {"total": 4, "completed": 1, "failed": 3})
    assert shown["expired_at"] is not None and b.cancelled_at is None
    assert [json.loads(x)["custom_id"] for x in bytes(b.output_file.content).decode().splitlines()] == ["c0"]
    errors = [json.loads(x) for x in bytes(b.error_file.content).decode().splitlines()]
    assert [e["custom_id"] for e in errors] == ["c1", "c2", "c3"]  # input order
    assert errors[0]["response"]["status_code"] == 400
    assert [e["error"]["code"] for e in errors[1:]] == ["batch_expired", "batch_expired"] and errors[1]["response"] is None


def test_a_lines_request_and_result_come_back_from_the_database_exactly() -> None:
    """On PostgreSQL (tests/site/test_postgresql.py runs this file there) a JSONField is jsonb,
    which sorted an object's keys (a JSON schema's properties, whose order structured output
    follows) and refused U+0000 in a string: such a line was a 500 at batch create, and such a
    reply could not be recorded, so its line ran again and again."""
    b = make_batch(0)
    body = {"model": "m", "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"zeta": {"type": "string"}, "a": {"type": "string"}, "mid": {"type": "integer"}}}}},
        "prompt": "nul \u0000 here"}
    line = Line.objects.create(batch=b, index=0, custom_id="c0", body=body)
    b.total = 1
    b.save()
    runner.begin(b.id)
    assert runner.claim(b.id).body == body
    reply = result("c0", 200)
    reply["response"]["body"] = {"choices": [{"text": "a\u0000b"}], "z": 1, "a": 2}
    runner.record(line.pk, True, reply)
    line.refresh_from_db()
    assert json.dumps(line.body) == json.dumps(body) and json.dumps(line.result) == json.dumps(reply)  # keys in order
    assert runner.finalize_if_done(b.id)
    b.refresh_from_db()
    assert json.loads(bytes(b.output_file.content)) == reply and b.completed == 1
    b.metadata = {"z": "nul \u0000", "a": "lone \ud800"}  # any string the API's JSON reader takes
    b.save()
    b.refresh_from_db()
    assert json.dumps(b.metadata) == json.dumps({"z": "nul \u0000", "a": "lone \ud800"})


@pytest.mark.django_db(transaction=True)
def test_a_cancel_racing_a_claim_waits_for_it_and_the_counts_match_the_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another head cancels just after a runner read "in progress" in its claim. On PostgreSQL
    nothing held the batch row: the cancel ended the batch at once (nothing was in flight), the
    claim leased the line anyway, and its result was counted on a batch already cancelled, with
    no output file. The claim now locks the batch row, so the cancel waits for the lease and the
    batch ends once the line does, its reply in the output file. (On SQLite, whose transactions
    take the write lock at their start, this always held; the PostgreSQL lane runs it there.)"""
    import threading

    from django.db import connections

    b = make_batch(1)
    runner.begin(b.id)
    real_status, cancels = runner.current_status, []

    def status_then_a_cancel(batch_id: str) -> str:
        seen = real_status(batch_id)
        if not cancels:

            def cancel() -> None:
                try:
                    runner.cancel(batch_id)
                finally:
                    connections.close_all()

            cancels.append(threading.Thread(target=cancel))
            cancels[0].start()
            cancels[0].join(1.0)  # on the old code it ends the batch within this second
        return seen

    monkeypatch.setattr(runner, "current_status", status_then_a_cancel)
    line = runner.claim(b.id)
    cancels[0].join(20)
    assert line is not None and Batch.objects.get(pk=b.id).status == "cancelling"  # waits for the line in flight
    runner.record(line.pk, True, result("c0", 200))
    assert runner.finalize_if_done(b.id)
    b.refresh_from_db()
    assert (b.status, b.completed, b.failed) == ("cancelled", 1, 0)
    assert b.output_file is not None and json.loads(bytes(b.output_file.content))["custom_id"] == "c0"


def test_a_result_after_the_batch_ended_changes_nothing() -> None:
    """A runner whose lease lapsed (it stalled past it) and whose batch ended meanwhile: its late
    result was counted on the ended batch, though no file holds it."""
    b = make_batch(2)
    runner.begin(b.id)
    line = runner.claim(b.id)
    assert line is not None
    Line.objects.filter(pk=line.pk).update(claimed_until=timezone.now() - timedelta(seconds=1))  # lapsed
    runner.cancel(b.id)[0]
    b.refresh_from_db()
    assert b.status == "cancelled"
    runner.record(line.pk, True, result("c0", 200))
    b.refresh_from_db()
    assert (b.completed, b.failed, b.output_file) == (0, 0, None)


def test_claiming_and_the_finalize_check_read_the_pending_lines_only() -> None:
    """A claim walked a batch's done lines in index order to find the first pending one: each
    claim cost grew with the lines finished, a 50,000-line batch's runner was quadratic
    (bench/batch_claim.py: 6.1 ms a claim at 50,000 lines, 1.5 ms at 1,000). Both queries go
    through the partial index of pending lines."""
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("the query plan asserted is SQLite's; PostgreSQL chooses by table statistics")
    b = make_batch(3)
    assert "batch_line_pending" in runner.claimable(b.id, timezone.now())[:1].explain()
    assert "batch_line_pending" in Line.objects.filter(batch_id=b.id, done=False).explain()
