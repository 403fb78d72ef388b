"""The activity writer at exit, when the database does not answer in time (activity/writer.py)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from activity import log as activity_log
from activity import writer as activity_writer
from activity.log import entry_fields
from api.records import RequestRecord


def test_rows_the_exit_could_not_wait_for_are_logged_not_lost_silently(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """At exit the writer gets EXIT_FLUSH_S; a database slower than that (locked, a failover)
    lost the batch being written and every row queued behind it, and the log said nothing: an
    operator missing a drain's last requests had no trace of why."""
    writer = activity_writer.ActivityWriter()
    monkeypatch.setattr(activity_writer, "_writer", writer)
    monkeypatch.setattr(activity_writer, "EXIT_FLUSH_S", 0.2)
    gate, taken = threading.Event(), threading.Event()

    def stuck_store(rows: Any, touches: Any) -> None:  # the database never answers before the exit
        taken.set()
        gate.wait(10)

    monkeypatch.setattr(activity_writer, "_store", stuck_store)
    monkeypatch.setattr(activity_log, "maybe_prune", lambda now=None: 0)  # no database here
    logger = logging.getLogger("superfluid.activity")  # it does not propagate to the root
    monkeypatch.setattr(logger, "handlers", [*logger.handlers, caplog.handler])
    try:
        activity_writer.submit(entry_fields(RequestRecord(endpoint="chat", request_id="first", status=200)))
        assert taken.wait(10)
        for i in range(3):
            activity_writer.submit(entry_fields(RequestRecord(endpoint="chat", request_id=f"q{i}", status=200)))
        activity_writer._flush_at_exit()
    finally:
        gate.set()
        writer.flush()
    lost = [r for r in caplog.records if r.name == "superfluid.activity" and r.levelno >= logging.WARNING]
    assert lost and "4 entries not written" in lost[-1].getMessage(), caplog.text  # the batch being written, 3 queued


@pytest.mark.django_db(transaction=True)
def test_rows_written_before_a_slow_prune_are_not_counted_lost_at_exit(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The writer prunes after a batch is committed. A prune still running at exit (a long
    backlog, a lock it waited for) made the exit log say the batch's rows were "not written",
    though they were in the database: an operator looked for requests that were never lost."""
    from activity.models import ActivityEntry

    writer = activity_writer.ActivityWriter()
    monkeypatch.setattr(activity_writer, "_writer", writer)
    monkeypatch.setattr(activity_writer, "EXIT_FLUSH_S", 0.2)
    gate, pruning = threading.Event(), threading.Event()

    def slow_prune(now: float | None = None) -> int:
        pruning.set()
        gate.wait(10)
        return 0

    monkeypatch.setattr(activity_log, "maybe_prune", slow_prune)
    logger = logging.getLogger("superfluid.activity")  # it does not propagate to the root
    monkeypatch.setattr(logger, "handlers", [*logger.handlers, caplog.handler])
    try:
        activity_writer.submit(entry_fields(RequestRecord(endpoint="chat", request_id="kept", status=200)))
        assert pruning.wait(10)  # the row is committed; the prune runs
        activity_writer._flush_at_exit()
    finally:
        gate.set()
        writer.flush()
    assert list(ActivityEntry.objects.values_list("request_id", flat=True)) == ["kept"]
    said = [r.getMessage() for r in caplog.records if r.name == "superfluid.activity" and r.levelno >= logging.WARNING]
    assert not any("not written" in line for line in said), said
